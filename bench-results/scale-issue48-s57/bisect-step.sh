#!/bin/bash
# usage: bisect-step.sh COMMIT  -> builds its benchserver, runs 3 holds-on 10000x100 runs (40 updates) with HEAD's scale
c=$1
d=/tmp/s57/bis/$c
if [ ! -x $d/benchserver ]; then
  rm -rf /tmp/s57/biswt; git -C /work/main worktree add -q --detach /tmp/s57/biswt $c
  mkdir -p $d && (cd /tmp/s57/biswt && go build -o $d/ ./examples/bench/benchserver) || { echo "build failed $c"; exit 1; }
  git -C /work/main worktree remove --force /tmp/s57/biswt
  cp /work/main/bin/bench/stock $d/
fi
for i in 1 2 3; do
  /work/main/bin/bench/scale -bin $d -scenarios 10000x100 -servers holds-on -runs 1 -updates 40 -idle 1s -out '' 2>&1 | grep ", holds-on:" | grep -o "update p50.*CPU [0-9.]* s" | sed "s/^/$c-$i /"
done
