#!/bin/bash
out=${1:-/tmp/s57/holds2.txt}
for i in 1 2 3 4; do
  if [ $((i%2)) = 1 ]; then order="new old"; else order="old new"; fi
  for b in $order; do
    if [ $b = new ]; then d=/work/main; else d=/tmp/old; fi
    (cd $d && ./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on -runs 1 -updates 40 -idle 1s -out '' 2>&1 | grep ", holds-on:" | sed "s/^/$b-$i /" >> $out)
  done
done
echo done >> $out
