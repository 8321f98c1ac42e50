import torch
from dualk import module_choice, autotune
import dualk.nn as dn
from dualk.nn import FusedMLP
seen = []
orig = module_choice.compiled_path
def spy(shape, rows, grad):
    r = orig(shape, rows, grad); seen.append((shape[1], rows, grad, r)); return r
spy._dynamo_marked_constant = True
module_choice.compiled_path = spy
flags = []
def probe(x):
    flags.append((dn._is_exporting(), torch.compiler.is_compiling()))
    return x * 2
m = FusedMLP((64, 64, 64, 16)).cuda().half()
x = torch.randn(4096, 64, device="cuda", dtype=torch.half)
with torch.no_grad():
    c = torch.compile(m, fullgraph=True)
    c(x)
    torch.compile(probe, fullgraph=True)(x)
print("compiled_path calls:", seen, "flags under dynamo:", flags)
print({k: (v["path"], v["times_us"]) for k, v in module_choice.details().items()})
