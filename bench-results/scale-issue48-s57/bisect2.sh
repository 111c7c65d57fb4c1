#!/bin/bash
# usage: bisect2.sh INDEX  (first-parent index) -> candidate vs 3989ac8, 3 runs each, alternating
i=$1; c=$(sed -n ${i}p /tmp/s57/fp.txt)
d=/tmp/s57/bis/$c
if [ ! -x $d/benchserver ]; then
  rm -rf /tmp/s57/biswt; git -C /work/main worktree add -q --detach /tmp/s57/biswt $c
  mkdir -p $d && (cd /tmp/s57/biswt && go build -o $d/ ./examples/bench/benchserver) || { echo "build failed $c"; exit 1; }
  git -C /work/main worktree remove --force /tmp/s57/biswt
  cp /work/main/bin/bench/stock $d/
fi
for r in 1 2 3; do
  if [ $((r%2)) = 1 ]; then order="old cand"; else order="cand old"; fi
  for v in $order; do
    b=$d; [ $v = old ] && b=/tmp/s57/bis/3989ac8
    /work/main/bin/bench/scale -bin $b -scenarios 10000x100 -servers holds-on -runs 1 -updates 40 -idle 1s -out '' 2>&1 | grep ", holds-on:" | grep -o "CPU [0-9.]* s, idle" | sed "s/^/fp$i-$v-$r /"
  done
done
