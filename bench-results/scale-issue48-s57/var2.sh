#!/bin/bash
for i in 1 2 3 4; do
 for v in fp37 fp38 head headoff; do
  e=""; d=/tmp/s57/var
  case $v in fp37) d=/tmp/s57/bis/2ac6b46529176d0702ca91d1a03e86c57ceb4067;; fp38) d=/tmp/s57/bis/d89f63ea7a5be7d25159f67492ec9556eee175a2;; headoff) e="NOLAG=1 NOOBS=1";; esac
  env $e /work/main/bin/bench/scale -bin $d -scenarios 10000x100 -servers holds-on -runs 1 -updates 40 -idle 1s -out '' 2>&1 | grep ", holds-on:" | grep -o "update p50.*CPU [0-9.]* s" | sed "s/^/$v-$i /"
 done
done
echo done
