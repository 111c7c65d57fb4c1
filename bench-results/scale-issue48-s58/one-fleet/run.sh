#!/bin/bash
# interleaved A/B with one fleet: HEAD's scale binary drives both builds' servers (benchserver and stock, which holds the guard), make bench's scenarios and servers, fixed windows
for i in 1 2 3; do
  if [ $((i%2)) = 1 ]; then order="new old"; else order="old new"; fi
  for b in $order; do
    if [ $b = new ]; then d=/work/main/bin/bench; else d=/tmp/old/bin/bench; fi
    /work/main/bin/bench/scale -bin $d -scenarios 1000x1000,10000x100 -servers holds-on,stock,guard-sotw,stock-sotw -runs 1 -updates 10 -idle 2s -out /tmp/ab58b/$b-$i > /tmp/ab58b/$b-$i.log 2>&1
    echo "$b-$i rc=$? $(date -u +%T)" >> /tmp/ab58b/times
  done
done
echo done > /tmp/ab58b/DONE
