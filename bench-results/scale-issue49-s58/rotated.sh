#!/bin/bash
# the 1.5 line as scale's own 3 rounds (-runs 3: interleaved, each run starts one server further along), default windows then fixed
cd /work/main
./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on,stock -runs 3 -updates 10 -idle 2s -out '' -default-windows > bench-results/scale-issue49-s58/rotated-default.log 2>&1
./bin/bench/scale -bin bin/bench -scenarios 10000x100 -servers holds-on,stock -runs 3 -updates 10 -idle 2s -out '' > bench-results/scale-issue49-s58/rotated-fixed.log 2>&1
