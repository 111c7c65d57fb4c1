#!/bin/bash
cd /work/main
for i in 1 2 3; do
  ./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on,stock -runs 1 -updates 10 -idle 2s -out '' -default-windows > /tmp/s57/r49/default-$i.log 2>&1
  ./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on,stock -runs 1 -updates 10 -idle 2s -out '' > /tmp/s57/r49/fixed-$i.log 2>&1
done
echo done > /tmp/s57/r49/done
