#!/bin/bash
for i in 1 2 3 4; do
 if [ $((i%2)) = 1 ]; then order="old fp37 head"; else order="head fp37 old"; fi
 for v in $order; do
  case $v in old) d=/tmp/s57/bis/3989ac8;; fp37) d=/tmp/s57/bis/2ac6b46529176d0702ca91d1a03e86c57ceb4067;; head) d=/work/main/bin/bench;; esac
  /work/main/bin/bench/scale -bin $d -scenarios 10000x100 -servers holds-on -runs 1 -updates 40 -idle 1s -out '' 2>&1 | grep ", holds-on:" | sed "s/^/$v-$i /"
 done
done
echo done
