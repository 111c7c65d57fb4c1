#!/bin/bash
# holds-on alone, this build (new) vs 3989ac8 (old), alternating, fixed windows: its own sync CPU
for i in 1 2 3 4 5; do
  if [ $((i%2)) = 1 ]; then order="new old"; else order="old new"; fi
  for b in $order; do
    if [ $b = new ]; then d=/work/main; else d=/tmp/old; fi
    (cd $d && ./bin/bench/scale -bin bin/bench -scenarios 1000x1000,10000x100 -servers holds-on -runs 1 -updates 10 -idle 1s -out '' 2>&1 | grep ", holds-on:" | sed "s/^/$b-$i /" >> /tmp/ab56/holds.txt)
  done
done
echo done >> /tmp/ab56/holds.txt
