# Shared helpers of the wirehead_torch SLURM scripts (sourced, not run).
#
# Settings come from the environment (submit.sh exports them; set them
# yourself when you sbatch a script directly):
#   WH_CONFIG     config.yaml of the store (required)
#   WH_RUN_DIR    folder of this run: logs, mongo.uri, train results (default: submit dir)
#   WH_SECONDS    every job ends by itself (exit 0) shortly after this many seconds
#   WH_PYTHON     python with wirehead_torch installed (default: python3 on PATH)
#   WIREHEAD_STORE  overrides the config's STORE (e.g. mongodb://host:27017/db)

WH_PYTHON=${WH_PYTHON:-python3}
WH_RUN_DIR=${WH_RUN_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}
export WH_PYTHON WH_RUN_DIR

wh_log() { echo "[$(date +%H:%M:%S) ${SLURM_JOB_ID:-local}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID} $(hostname)] $*"; }

wh_die() { wh_log "error: $*" >&2; exit 2; }

wh_cli() { "$WH_PYTHON" -m wirehead_torch.apps.cli "$@"; }
# The same as a plain command, for `cmd &` and wh_run_forwarding: a function
# run in the background gets a subshell of its own, and a SIGTERM sent to
# that pid would end the subshell, not python.
WH_CLI=("$WH_PYTHON" -m wirehead_torch.apps.cli)

# The address of a SLURM node. Node names need not resolve (several slurmd
# on one host, clusters without DNS for node names): ask slurmctld.
wh_node_addr() {
    local addr
    addr=$(scontrol show node "$1" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p' | head -n1)
    echo "${addr:-$1}"
}

# The first node of this job (torchrun's rendezvous host).
wh_first_node() { scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1; }

# --seconds T for the wirehead-torch commands when WH_SECONDS is set.
wh_seconds_opt() { if [ -n "${WH_SECONDS:-}" ]; then echo "--seconds $WH_SECONDS"; fi; }

# Uses the MongoDB URI written by mongod.sbatch ($WH_RUN_DIR/mongo.uri) when
# no WIREHEAD_STORE is set; waits for it up to WH_URI_WAIT seconds (300).
wh_store_from_run() {
    local f="$WH_RUN_DIR/mongo.uri" waited=0
    [ -n "${WIREHEAD_STORE:-}" ] && return 0
    [ -n "${WH_MONGOD_JOB:-}" ] || return 0
    while [ ! -s "$f" ]; do
        [ "$waited" -ge "${WH_URI_WAIT:-300}" ] && wh_die "no $f after ${WH_URI_WAIT:-300}s"
        sleep 2; waited=$((waited + 2))
    done
    WIREHEAD_STORE=$(cat "$f"); export WIREHEAD_STORE
}

# The store this job uses (WIREHEAD_STORE or the config's), credentials left out.
wh_store_kind() {
    "$WH_PYTHON" -c 'import sys; from wirehead_torch.config import load_config
print(load_config(sys.argv[1])["STORE"].split("://")[0])' "$WH_CONFIG"
}

# The config's LOCAL_CACHE (empty when unset): with a mongodb:// store, one
# relay per node fills it (docs/relay.md).
wh_local_cache() {
    "$WH_PYTHON" -c 'import sys; from wirehead_torch.config import load_config
print(load_config(sys.argv[1])["LOCAL_CACHE"] or "")' "$WH_CONFIG"
}

# Runs a command (not a shell function: see WH_CLI) in the background and
# passes SIGTERM/SIGINT on to it, so SLURM's --signal=B:TERM@N (pre-emption,
# the time limit coming) reaches the wirehead process, which finishes its
# step and exits 0. `wait` returns
# early when a trapped signal arrives, so wait again for the real end.
wh_run_forwarding() {
    "$@" &
    local pid=$!
    trap 'kill -TERM '"$pid"' 2>/dev/null || true' TERM INT
    wh_wait_pid "$pid"
}

# Waits for a child of this shell through any number of trapped signals;
# returns its exit status (bash keeps it after the first wait reaped it).
wh_wait_pid() {
    local rc=0
    while kill -0 "$1" 2>/dev/null; do wait "$1" || true; done
    wait "$1" || rc=$?
    trap - TERM INT
    return "$rc"
}

wh_need_config() {
    [ -n "${WH_CONFIG:-}" ] || wh_die "WH_CONFIG is not set (the store's config.yaml)"
    [ -r "$WH_CONFIG" ] || wh_die "cannot read WH_CONFIG=$WH_CONFIG"
}

# One node's torchrun (run by srun, one task per node): static rendezvous
# at the first node's address; WH_NPROC ranks per node (default 1). Runs
# WH_TRAIN_SCRIPT if set, else the demo's 3D U-Net (wirehead-torch train),
# with WH_TRAIN_ARGS appended.
wh_torchrun_node() {
    local fix target
    # torch < 2.0 on Python >= 3.11 needs explicit --redirects/--tee (see
    # wirehead_torch/apps/demo.py); empty elsewhere
    fix=$("$WH_PYTHON" -c 'import sys; from wirehead_torch.apps.demo import _torchrun_py311_workaround as f
print(" ".join(f(int(sys.argv[1]))))' "${WH_NPROC:-1}")
    if [ -n "${WH_TRAIN_SCRIPT:-}" ]; then
        target=("$WH_TRAIN_SCRIPT")
    else
        # shellcheck disable=SC2207
        target=(-m wirehead_torch.apps.cli train --config "$WH_CONFIG" --out "$WH_RUN_DIR/train"
                $(wh_seconds_opt))
    fi
    wh_log "torchrun: node rank $SLURM_NODEID of $SLURM_NNODES, rendezvous $WH_MASTER_ADDR:$WH_MASTER_PORT"
    # shellcheck disable=SC2086
    exec "$WH_PYTHON" -m torch.distributed.run --nnodes "$SLURM_NNODES" \
        --nproc_per_node "${WH_NPROC:-1}" --node_rank "$SLURM_NODEID" \
        --master_addr "$WH_MASTER_ADDR" --master_port "$WH_MASTER_PORT" $fix \
        "${target[@]}" ${WH_TRAIN_ARGS:-}
}
