#!/bin/bash
cd /work/main
for i in 1 2 3; do
  ./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on,stock -runs 1 -updates 10 -idle 2s -out '' -default-windows > bench-results/scale-issue49-s58/default-$i.log 2>&1
  ./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on,stock -runs 1 -updates 10 -idle 2s -out '' > bench-results/scale-issue49-s58/fixed-$i.log 2>&1
done
echo done > bench-results/scale-issue49-s58/done
