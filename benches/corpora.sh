#!/usr/bin/env bash
# Builds corpora of other kinds than tiny shakespeare from pinned public sources, offline once the source
# is on disk, and prepares each with `dormouse prepare` (its manifest holds the fingerprint).
#   bash benches/corpora.sh kernel-docs OUT_DIR [DEB]
#     prose: the Linux kernel's documentation (reStructuredText, 24.2 MB in 3,184 documents) from
#     Debian's linux-doc-6.1 6.1.176-1; DEB is that .deb (default: `apt-get download` it into OUT_DIR);
#     its sha256 is checked. Held out: 10 % of the documents, by a hash of their names.
#   bash benches/corpora.sh python-stdlib OUT_DIR
#     source code: the running interpreter's standard library, the default corpus (31.5 MB on 3.11.7).
# OUT_DIR/corpus is the prepared corpus; OUT_DIR/src holds its inputs (carry these to a GPU machine).
set -euo pipefail
name=${1:?NAME: kernel-docs or python-stdlib}
out=${2:?OUT_DIR}
mkdir -p "$out"
case $name in
kernel-docs)
  pkg=linux-doc-6.1_6.1.176-1_all.deb
  sha=0d843674607703b9ef8c1db5e715c38ed52ff23574feabfe0d961d552126859f
  deb=${3:-$out/$pkg}
  if [[ ! -f $deb ]]; then (cd "$out" && apt-get download linux-doc-6.1=6.1.176-1); fi
  echo "$sha  $deb" | sha256sum --check --quiet
  rm -rf "$out/deb" "$out/src"
  dpkg-deb -x "$deb" "$out/deb"
  # the .rst sources only: the package's HTML, YAML bindings and ABI notes are other kinds of text
  (cd "$out/deb/usr/share/doc/linux-doc-6.1" && find Documentation -name '*.rst.gz' -print0 |
    tar cf - --null -T -) | (mkdir -p "$out/src" && tar xf - -C "$out/src")
  rm -rf "$out/deb"
  python3 -m dormouse prepare "$out/src/Documentation" --heldout-fraction 0.1 --out "$out/corpus"
  ;;
python-stdlib)
  # the default corpus's documents (dormouse/data/default_corpus.py), prepared under OUT_DIR
  python3 -c "from dormouse.data.default_corpus import default_corpus_dir; print(default_corpus_dir())" |
    xargs -I{} cp -r {} "$out/corpus"
  python3 -m dormouse inspect "$out/corpus" | sed -n '1,/^fingerprint/p'
  ;;
*)
  echo "unknown corpus $name: kernel-docs or python-stdlib" >&2
  exit 2
  ;;
esac
