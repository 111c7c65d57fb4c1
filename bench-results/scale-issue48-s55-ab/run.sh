#!/bin/bash
# interleaved A/B at 10000x100: this build (new: holds-on, holds-on-noauth, stock) vs 3989ac8 (old: holds-on, stock), fixed windows
for i in 1 2 3 4; do
  if [ $((i%2)) = 1 ]; then order="new old"; else order="old new"; fi
  for b in $order; do
    if [ $b = new ]; then d=/work/main; s=holds-on,holds-on-noauth,stock; else d=/tmp/old; s=holds-on,stock; fi
    (cd $d && ./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers $s -runs 1 -updates 10 -idle 2s -out /tmp/ab2/$b-$i > /tmp/ab2/$b-$i.log 2>&1)
  done
done
# grpc-go's default windows, this build: 3 rounds
(cd /work/main && ./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on,holds-on-noauth,stock -runs 3 -updates 10 -idle 2s -default-windows -out /tmp/ab2/new-defwin > /tmp/ab2/new-defwin.log 2>&1)
echo done > /tmp/ab2/DONE
cd /work/main && bin/bench/guardfleet -bin bin/bench -runs 3 -scenarios sotw:10000 -caches mux -pin -out bench-results/guardfleet/issue49-s55/mux-sotw10000-pinned > /tmp/ab2/gf-pin.log 2>&1
echo done2 > /tmp/ab2/DONE2
