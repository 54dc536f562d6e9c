#!/usr/bin/env bash
# Launch the TF backend as an external two-worker cluster, the way Kubeflow's TFJob or Ray would:
# each process gets TF_CONFIG naming the cluster and its own task, and runs `dualtrain run` as one
# worker of it. Worker 0 (the chief) writes the run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
cluster='{"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]}'
pids=()
for i in 0 1; do
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
    python -m dualtrain run --backend tf --config configs/mnist_mlp.yaml \
    --set tf.strategy=multi_worker --set train.epochs=1 --out runs/example-tf-config --overwrite &
  pids+=($!)
done
# A plain `wait` would report success whatever the workers did; wait for each and keep the failure.
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
