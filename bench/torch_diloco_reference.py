#!/usr/bin/python3
"""DiLoCo's outer step in torch (Debian's python3-torch), the reference for src/parallel/diloco.ts:
three ranks start from the same weights; in each of 4 outer phases every rank's weights move to
fixed values (standing for its H inner steps); then, as torchft's DiLoCo does, the outer
optimizer's gradient is the average over the ranks of (last outer weights - the rank's weights),
and torch.optim.SGD(lr=0.7, momentum=0.9, nesterov=True) steps the last outer weights. Writes the
inputs and torch's outer weights after each phase to test/fixtures/torch_diloco.json, which
test/diloco.test.ts holds DiLoCo to; then 4 more phases whose pseudo-gradients are weighed by
each rank's samples ("weighted").

  /usr/bin/python3 bench/torch_diloco_reference.py
"""
import json, math, os
import torch

torch.set_num_threads(1)
RANKS, PHASES, NUMEL = 3, 4, 24
LR, MOMENTUM = 0.7, 0.9

def values(n, seed, scale):
    # A fixed, engine-independent sequence (no RNG): sin of an index, cast to float32.
    return [float(torch.tensor(math.sin(seed * 7.1 + i * 1.37) * scale, dtype=torch.float32)) for i in range(n)]

start = values(NUMEL, 1, 0.5)
outer = torch.nn.Parameter(torch.tensor(start, dtype=torch.float32))
opt = torch.optim.SGD([outer], lr=LR, momentum=MOMENTUM, nesterov=True, foreach=False)
phases = []
for phase in range(PHASES):
    # Each rank's weights after its inner steps: the outer weights plus a drift of its own.
    local = [(outer.detach() + torch.tensor(values(NUMEL, 10 + phase * RANKS + r, 0.05), dtype=torch.float32)) for r in range(RANKS)]
    pseudo = torch.stack([outer.detach() - w for w in local])
    # torch's all-reduce 'avg' of float32 sums then divides: the same order as the ring's here.
    grad = pseudo.sum(0) / RANKS
    outer.grad = grad.clone()
    opt.step()
    phases.append({"local": [[float(x) for x in w] for w in local], "outer": [float(x) for x in outer.detach()]})

# Weighed by samples (balanced batches give a slow rank fewer): the outer gradient is the
# samples-weighted mean of the pseudo-gradients, sum(n_r * (outer - w_r)) / sum(n_r).
SAMPLES = [[6, 2, 0], [3, 3, 2], [1, 6, 1], [4, 4, 4]]
outer = torch.nn.Parameter(torch.tensor(start, dtype=torch.float32))
opt = torch.optim.SGD([outer], lr=LR, momentum=MOMENTUM, nesterov=True, foreach=False)
weighted = []
for phase in range(PHASES):
    local = [(outer.detach() + torch.tensor(values(NUMEL, 40 + phase * RANKS + r, 0.05), dtype=torch.float32)) for r in range(RANKS)]
    n = torch.tensor(SAMPLES[phase], dtype=torch.float64)
    pseudo = torch.stack([(outer.detach() - w).double() for w in local])
    outer.grad = ((pseudo * n[:, None]).sum(0) / n.sum()).float()
    opt.step()
    weighted.append({"samples": SAMPLES[phase], "local": [[float(x) for x in w] for w in local], "outer": [float(x) for x in outer.detach()]})

out = {"torch": torch.__version__, "lr": LR, "momentum": MOMENTUM, "start": start, "phases": phases, "weighted": weighted}
path = os.path.join(os.path.dirname(__file__), "..", "test", "fixtures", "torch_diloco.json")
with open(path, "w") as f:
    json.dump(out, f)
print(f"wrote {path}: {PHASES} outer steps of {RANKS} ranks, torch {torch.__version__}")
