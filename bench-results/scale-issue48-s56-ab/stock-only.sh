#!/bin/bash
cd /work/main
for i in 1 2 3; do
  for b in new old; do
    if [ $b = new ]; then d=bin/bench; else d=/tmp/old/bin/bench; fi
    ./bin/bench/scale -bin $d -scenarios 10000x100 -servers stock -runs 1 -updates 5 -idle 1s -out '' 2>&1 | grep "10000x100, stock:" | sed "s/^/$b-$i /" >> /tmp/ab56/stock.txt
  done
done
echo done >> /tmp/ab56/stock.txt
