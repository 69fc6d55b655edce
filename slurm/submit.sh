#!/bin/bash
# Submits one wirehead run: generators (job array), manager, training.
#
#   slurm/submit.sh --config CFG [--generators N] [--procs P] [--gen-module M:F]
#                   [--train-nodes K] [--train-script S] [--seconds T]
#                   [--store URI | --mongod] [--run-dir DIR]
#                   [--gen-args "..."] [--train-args "..."] [--sbatch-args "..."]
#
# One node (--train-nodes 1, the default) on an shm:// store: one job, the
# manager and P generator processes inside the training allocation.
# Several nodes, or --store mongodb://...: a generator array of N tasks with
# P processes each, a manager job and a K-node torchrun job, all on MongoDB
# (--mongod also starts mongod.sbatch and the others read its URI).
# With --seconds T every job ends by itself (exit 0) shortly after T.
# Logs, the MongoDB URI and training results go to the run dir.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() { sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit "${1:-2}"; }

config="" generators=2 procs="" gen_module=synth train_nodes=1 train_script=""
seconds="" store="" mongod=0 run_dir="" gen_args="" train_args="" sbatch_args=""
while [ $# -gt 0 ]; do
    case "$1" in
        --config) config=$2; shift 2;;
        --generators) generators=$2; shift 2;;
        --procs) procs=$2; shift 2;;
        --gen-module) gen_module=$2; shift 2;;
        --train-nodes) train_nodes=$2; shift 2;;
        --train-script) train_script=$2; shift 2;;
        --seconds) seconds=$2; shift 2;;
        --store) store=$2; shift 2;;
        --mongod) mongod=1; shift;;
        --run-dir) run_dir=$2; shift 2;;
        --gen-args) gen_args=$2; shift 2;;
        --train-args) train_args=$2; shift 2;;
        --sbatch-args) sbatch_args=$2; shift 2;;
        -h|--help) usage 0;;
        *) echo "submit.sh: unknown option $1" >&2; usage;;
    esac
done
[ -n "$config" ] || { echo "submit.sh: --config is required" >&2; usage; }
[ -r "$config" ] || { echo "submit.sh: cannot read $config" >&2; exit 2; }
for v in generators train_nodes; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "submit.sh: --${v//_/-} must be a positive integer" >&2; exit 2; }
done
if [ -n "$seconds" ] && ! [[ $seconds =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    echo "submit.sh: --seconds must be a number" >&2; exit 2
fi
WH_PYTHON=${WH_PYTHON:-python3}
"$WH_PYTHON" -c 'import wirehead_torch' 2>/dev/null ||
    { echo "submit.sh: $WH_PYTHON cannot import wirehead_torch (activate its venv or set WH_PYTHON)" >&2; exit 2; }

config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
run_dir=${run_dir:-$PWD/wh-run-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$run_dir/logs"
run_dir=$(cd "$run_dir" && pwd)
[ -n "$store" ] && export WIREHEAD_STORE=$store
export WH_CONFIG=$config WH_RUN_DIR=$run_dir WH_SLURM_DIR=$here WH_PYTHON
export WH_SECONDS=$seconds WH_GEN_MODULE=$gen_module WH_PROCS=$procs
export WH_GEN_ARGS=$gen_args WH_TRAIN_ARGS=$train_args WH_TRAIN_SCRIPT=$train_script
[ -n "$train_script" ] && WH_TRAIN_SCRIPT=$(cd "$(dirname "$train_script")" && pwd)/$(basename "$train_script")

kind=$(WH_CONFIG=$config "$WH_PYTHON" -c 'import sys; from wirehead_torch.config import load_config
print(load_config(sys.argv[1])["STORE"].split("://")[0])' "$config")
[ "$mongod" = 1 ] && kind=mongodb
if [ "$kind" = shm ] && [ "$train_nodes" -gt 1 ]; then
    echo "submit.sh: $train_nodes training nodes need MongoDB: --store mongodb://HOST:PORT/DB or --mongod" >&2
    exit 2
fi
# shellcheck disable=SC2206
extra=($sbatch_args)
sb() { sbatch --parsable --chdir "$run_dir" "${extra[@]}" "$@" | cut -d';' -f1; }
ids=()
after=""
if [ "$mongod" = 1 ]; then
    WH_MONGOD_JOB=$(sb --output "$run_dir/logs/mongod-%j.out" "$here/mongod.sbatch")
    export WH_MONGOD_JOB
    after="--dependency=after:$WH_MONGOD_JOB"
    ids+=("mongod=$WH_MONGOD_JOB")
fi
if [ "$kind" = shm ]; then
    train=$(sb --nodes 1 --output "$run_dir/logs/train-%j.out" "$here/train.sbatch")
    ids+=("train=$train")
else
    [ -n "$procs" ] && pc=(--cpus-per-task "$procs") || pc=()
    gen=$(sb $after --array "0-$((generators - 1))" "${pc[@]}" \
          --output "$run_dir/logs/gen-%A_%a.out" "$here/generators.sbatch")
    mgr=$(sb $after --output "$run_dir/logs/manager-%j.out" "$here/manager.sbatch")
    # training starts once the generators have started
    train=$(sb --dependency="after:$gen${WH_MONGOD_JOB:+:$WH_MONGOD_JOB}" --nodes "$train_nodes" \
            --output "$run_dir/logs/train-%j.out" "$here/train.sbatch")
    ids+=("generators=$gen" "manager=$mgr" "train=$train")
fi
echo "$run_dir" > "$run_dir/run_dir"
printf '%s\n' "${ids[@]}" > "$run_dir/jobs"
echo "submitted: ${ids[*]}"
echo "run dir:   $run_dir (logs/, train/, jobs)"
status_env=""
[ -n "$store" ] && status_env="WIREHEAD_STORE='$store' "
[ "$mongod" = 1 ] && status_env="WIREHEAD_STORE=\$(cat $run_dir/mongo.uri) "
echo "watch:     squeue -u \$USER; ${status_env}wirehead-torch status --config $config"
echo "stop:      scancel $(printf '%s ' "${ids[@]#*=}")"
