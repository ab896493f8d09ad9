#!/bin/sh
# The tests of sum.sh. Exit 0 when all pass.
fail=0
check() {
  want=$1; shift
  got=$(sh ./sum.sh "$@")
  if [ "$got" = "$want" ]; then
    echo "ok   sum $* = $got"
  else
    echo "FAIL sum $* = $got (want $want)"; fail=1
  fi
}
check 0
check 3 1 2
check 10 1 2 3 4
exit $fail
