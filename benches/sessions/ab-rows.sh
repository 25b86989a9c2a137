# Sourced by the next-h200-*.sh scripts: ab_rows_cmd appends to cmds one device command that runs every row as one
# `dormouse ab` with a --b per row (one process: its start-up once; the first row trains arm A, the others
# reuse it) into /tmp/PREFIXrows/b<i>. It stops itself 30 s before the call's deadline (LEFT_S, exported by
# gpu_session.sh) so that the rows it finished are copied back: PREFIXrows-b<i>.json (the name
# collect_session.py gives the rows' logs) and PREFIXrows-b<i>.b.metrics.jsonl per row,
# PREFIXrows.a.metrics.jsonl (arm A, seed 0), PREFIXrows.log and PREFIXrows-table.md (which b<i> is which row).
#   ab_rows_cmd "python3 -m dormouse ab <shared flags>" PREFIX "row1 row2 ..."   (B: row -> arm B's flags)
# An unknown row stops the script before anything is sent.
ab_rows_cmd() {
  local bs="" keep="" i=0 row dir="/tmp/${2}rows"
  for row in $3; do
    [[ -n "${B[$row]+set}" ]] || { echo "unknown row $row; rows: ${!B[*]}" >&2; exit 2; }
    i=$((i + 1))
    bs+=" --b '${B[$row]}'"
    keep+="cp $dir/b$i/ab.json \$OUT/${2}rows-b$i.json 2>/dev/null; "
    keep+="cp $dir/b$i/b/seed-0/metrics.jsonl \$OUT/${2}rows-b$i.b.metrics.jsonl 2>/dev/null; "
  done
  keep+="cp $dir/b1/a/seed-0/metrics.jsonl \$OUT/${2}rows.a.metrics.jsonl 2>/dev/null; "
  keep+="cp $dir/table.md \$OUT/${2}rows-table.md 2>/dev/null"
  cmds+=("timeout \$((LEFT_S - 30)) $1 --a ''$bs --out $dir > \$OUT/${2}rows.log 2>&1; $keep; grep -a -E '^(ab: comparison|overall|ms/step|verdict)' \$OUT/${2}rows.log | cut -c1-160; cat \$OUT/${2}rows-table.md 2>/dev/null")
}
