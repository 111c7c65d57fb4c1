#!/bin/bash
# interleaved A/B: current (new) vs 3989ac8 (old), 10000x100 holds-on,stock
for i in 1 2 3 4 5; do
  if [ $((i%2)) = 1 ]; then order="new old"; else order="old new"; fi
  for b in $order; do
    if [ $b = new ]; then d=/work/main; else d=/tmp/old; fi
    (cd $d && ./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on,stock -runs 1 -updates 10 -idle 2s -out /tmp/ab/$b-$i > /tmp/ab/$b-$i.log 2>&1)
  done
done
echo done > /tmp/ab/DONE
