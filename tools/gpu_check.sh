#!/bin/bash
# tools/gpu_check.py on a bare GPU machine (Python 3.12 with torch and transformers, no
# registry). Run from the repository root after building .gpu/ here (ignored by git):
#
#   echo /.gpu/ >> .git/info/exclude; mkdir -p .gpu/whl
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .gpu/whl transformer_lens==4.3.0 \
#       datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 gguf==0.19.0     # ~2.6 MB
#   git archive HEAD core tools/__init__.py tools/gpu_check.py | gzip -9 > .gpu/snap.tgz
#   # the embedded tokenizer as RAGSCOPE_CACHE_DIR/models/smollm2-135m-instruct-v1/:
#   tar czf .gpu/tok.tgz -C "$RAGSCOPE_CACHE_DIR_WITH_IT" models                  # ~0.6 MB
#   python -m tools.gpu_check --text-record .gpu/text.json.gz   # spaCy/LangChain/embedder
#   cp tools/gpu_check.sh .gpu/run.sh
#   # optional: .gpu/stub/datasets/, a stand-in for TransformerLens's datasets imports,
#   # used only if the carried datasets cannot import there (it could on 2026-11-26)
#
# then on the machine: bash .gpu/run.sh --device cuda --dtypes bfloat16,float32
# The committed core travels as a snapshot, so the run is of one commit, not of a
# working tree that others are editing.
set -o pipefail
export PYTHONUNBUFFERED=1
R=$PWD
PY=${PY:-python3}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/smi.txt"
if [ -z "$SKIP_PIP" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/whl/*.whl || exit 3
fi
rm -rf /tmp/snap /tmp/rc && mkdir -p /tmp/snap /tmp/rc || exit 4
tar xzf .gpu/snap.tgz -C /tmp/snap && ln -sfn "$R/assets" /tmp/snap/assets || exit 4
tar xzf .gpu/tok.tgz -C /tmp/rc || exit 4
export RAGSCOPE_CACHE_DIR=/tmp/rc PYTHONPATH=/tmp/snap:/tmp/site
cd /tmp/snap
if ! $PY -c "import transformer_lens.model_bridge" 2>"$OUT/tl_import.txt"; then
  tail -3 "$OUT/tl_import.txt"
  echo "the carried datasets does not import here: TransformerLens gets the stand-in"
  export PYTHONPATH=/tmp/snap:$R/.gpu/stub:/tmp/site
  $PY -c "import transformer_lens.model_bridge" || exit 5
fi
timeout "${LIMIT:-420}" $PY -m tools.gpu_check --text-replay "$R/.gpu/text.json.gz" \
  --out "$OUT/gpu.jsonl" "$@" 2>&1 | grep --line-buffered -v "Loading weights" | tee "$OUT/log.txt"
rc=$?
$PY -m tools.gpu_check --table "$OUT/gpu.jsonl" | tee "$OUT/table.md"
exit $rc
