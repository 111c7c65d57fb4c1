#!/bin/bash
# interleaved A/B: this build (new) vs 3989ac8 (old), make bench's scenarios and servers, grpc-go fixed windows (make bench's default)
for i in 1 2 3; do
  if [ $((i%2)) = 1 ]; then order="new old"; else order="old new"; fi
  for b in $order; do
    if [ $b = new ]; then d=/work/main; else d=/tmp/old; fi
    (cd $d && ./bin/bench/scale -bin bin/bench -scenarios 1000x1000,10000x100 -servers holds-on,stock,guard-sotw,stock-sotw -runs 1 -updates 10 -idle 2s -out /tmp/ab58/$b-$i > /tmp/ab58/$b-$i.log 2>&1)
    echo "$b-$i rc=$? $(date -u +%T)" >> /tmp/ab58/times
  done
done
echo done > /tmp/ab58/DONE
