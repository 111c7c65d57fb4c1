#!/bin/bash
for i in 1 2 3; do
 for v in base nolag noobs both; do
  case $v in base) e="";; nolag) e="NOLAG=1";; noobs) e="NOOBS=1";; both) e="NOLAG=1 NOOBS=1";; esac
  env $e /work/main/bin/bench/scale -bin /tmp/s57/var -scenarios 10000x100 -servers holds-on -runs 1 -updates 40 -idle 1s -out '' 2>&1 | grep ", holds-on:" | grep -o "update p50.*CPU [0-9.]* s" | sed "s/^/$v-$i /"
 done
done
echo done
