"""Load w_0 and w_N of a pathkernel run with numpy alone: python3 load_path.py RUN"""
import json, sys, numpy as np
run = sys.argv[1]
manifest = json.load(open(f"{run}/manifest.json"))
ckpts = {c["step"]: np.load(f"{run}/{c['file']}") for c in manifest["checkpoints"]}
w0, wN = ckpts[0], ckpts[manifest["steps"]]
P = manifest["parameters"]["count"]
assert w0.shape == wN.shape == (P,) and w0.dtype == np.float64
t = manifest["parameters"]["tensors"][0]
first = wN[t["offset"]:t["offset"] + t["numel"]].reshape(t["shape"])
print(json.dumps({"steps": manifest["steps"], "P": P, "w0_norm": float(np.linalg.norm(w0)), "wN_norm": float(np.linalg.norm(wN)), "first_tensor": t["name"], "first_tensor_shape": list(first.shape), "moved": float(np.linalg.norm(wN - w0))}))
