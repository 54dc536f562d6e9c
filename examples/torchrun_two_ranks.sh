#!/usr/bin/env bash
# Launch the torch backend with torchrun instead of letting dualtrain start the workers.
# torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; each process runs
# `dualtrain run` as one rank, and rank 0 writes the run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29512 \
  -m dualtrain run --backend torch --config configs/mnist_mlp.yaml --set train.epochs=1 \
  --out runs/example-torchrun --overwrite
