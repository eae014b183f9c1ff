#!/usr/bin/python3
"""torch.optim's reference for src/optim.ts: runs SGD, Adam and AdamW of torch (Debian's
python3-torch, 1.13) on fixed float32 parameters and gradients, and writes the inputs and torch's
results to test/fixtures/torch_optim.json, which test/optim.test.ts pins the host optimizers to.

  apt-get install -y python3-torch && /usr/bin/python3 bench/torch_optim_reference.py
"""
import json, math, os
import torch

torch.set_num_threads(1)
STEPS = 20
SHAPES = [[3, 5], [5], [2, 3, 2]]

def values(n, seed, scale):
    # A fixed, engine-independent sequence (no RNG): sin of an index, cast to float32.
    return [math.sin(seed * 7.1 + i * 1.37) * scale for i in range(n)]

def tensor(vals, shape):
    return torch.tensor(vals, dtype=torch.float32).reshape(shape)

CASES = [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("adam", dict(lr=1e-2)),
    ("adam", dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)),
    ("adamw", dict(lr=1e-2, weight_decay=0.1)),
]

def run(kind, opts):
    params = [torch.nn.Parameter(tensor(values(math.prod(s), k + 1, 0.5), s)) for k, s in enumerate(SHAPES)]
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    opt = cls(params, foreach=False, **opts)
    grads = []
    for step in range(STEPS):
        step_grads = []
        for k, (p, s) in enumerate(zip(params, SHAPES)):
            # Gradients of varied magnitude, some tiny (Adam's eps matters), some large.
            scale = 10.0 ** ((step % 5) - 2)
            g = tensor(values(math.prod(s), 100 + step * 10 + k, scale), s)
            p.grad = g.clone()
            step_grads.append([float(x) for x in g.flatten()])
        grads.append(step_grads)
        opt.step()
    state = []
    for p in params:
        st = opt.state[p]
        state.append({k: [float(x) for x in v.flatten()] for k, v in st.items() if k != "step" and v is not None})
    return {
        "kind": kind,
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in opts.items()},
        "grads": grads,
        "final": [[float(x) for x in p.detach().flatten()] for p in params],
        "state": state,
    }

cases = [run(kind, opts) for kind, opts in CASES]
initial = [[float(x) for x in tensor(values(math.prod(s), k + 1, 0.5), s).flatten()] for k, s in enumerate(SHAPES)]
out = {"torch": torch.__version__, "steps": STEPS, "shapes": SHAPES, "initial": initial, "cases": cases}
path = os.path.join(os.path.dirname(__file__), "..", "test", "fixtures", "torch_optim.json")
with open(path, "w") as f:
    json.dump(out, f)
print(f"wrote {os.path.normpath(path)}: torch {torch.__version__}, {len(cases)} cases x {STEPS} steps")
