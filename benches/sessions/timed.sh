# Sourced by session scripts: `timed NAME "<command>" [PATTERN]` prints one device command that runs the
# command with its output in $OUT/NAME.log, appends the whole command's wall time (bash's EPOCHREALTIME
# before and after, start-up included) to that log, and prints the log's lines matching PATTERN (default:
# the bench's ms_per_step and first_step, and errors).
timed() {
  local name=$1 cmd=$2 pattern=${3:-ms_per_step|first_step|Error}
  echo "s=\$EPOCHREALTIME; $cmd > \$OUT/$name.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/$name.log; grep -a -E '$pattern' \$OUT/$name.log | cut -c1-200"
}
# `pytest_cmd NAME LIMIT TESTS...` prints one device command: a pytest run with its own time limit, its log
# in $OUT/NAME.log, then its exit status and the log's pass/fail lines.
pytest_cmd() {
  local name=$1 limit=$2; shift 2
  echo "timeout $limit python3 -m pytest -q -p no:cacheprovider -s $* > \$OUT/$name.log 2>&1; echo \"$name: exit \$?\"; grep -a -E 'passed|failed|FAILED|max.d' \$OUT/$name.log | tail -6"
}
# `interleaved ROUNDS NAME "<command>" [NAME "<command>" ...]` appends to the caller's `cmds` array the arms
# of an A/B, round by round (arm 1, arm 2, ..., then again): each arm's log NAME-<round>.log; a command may
# use $round (its round, 1-based), written \$round in the caller's double quotes.
interleaved() {
  local rounds=$1 round i; shift
  for ((round = 1; round <= rounds; round++)); do
    for ((i = 1; i < $#; i += 2)); do
      local name=${!i} j=$((i + 1))
      cmds+=("$(timed "$name-$round" "${!j//\$round/$round}")")
    done
  done
}
# `base_bench COMMIT` prints a `dormouse bench` command run from .base-tree/COMMIT (`mkdir -p
# .base-tree/C && git archive C dormouse | tar x -C .base-tree/C`: that commit's package first on
# sys.path), its rows and logs into this tree's; the caller's $S holds the flags, $V the data folder.
base_bench() {
  echo "cd .base-tree/$1 && DORMOUSE_COMMIT=$1 python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
}
