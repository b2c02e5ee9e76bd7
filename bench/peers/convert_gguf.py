#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py on the upstream-named tiny V4 checkpoint.

  venv/bin/python convert_gguf.py LLAMA_CPP_DIR MODEL_DIR --outfile OUT.gguf --outtype f32|bf16

The converter's DeepSeek V4 class only knows real V4 checkpoints, whose routed experts are FP4
(int8-packed e2m1 + e8m0 `.scale`) and are repacked to MXFP4. Our random checkpoint stores the
experts unquantised, so this wrapper replaces that one method: when an expert has no `.scale`,
the experts of a layer are stacked into the same [E, out, in] tensor and written in the source
dtype (F32 or BF16) instead. Everything else (config keys, names, hash routing, the tokenizer)
goes through the converter unchanged.
"""

import runpy
import sys
from pathlib import Path

import numpy as np


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    lcpp = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(lcpp))
    sys.path.insert(1, str(lcpp / "gguf-py"))
    import gguf  # noqa: E402
    import torch  # noqa: E402
    from conversion import deepseek  # noqa: E402
    from conversion.base import LazyTorchTensor  # noqa: E402

    cls = deepseek.DeepseekV4Model
    original = cls._write_mxfp4_expert_tensor

    def write_expert_tensor(self, bid, proj, tensor_key):
        first_scale = f"layers.{bid}.ffn.experts.0.{proj}.scale"
        if first_scale in self.model_tensors:
            return original(self, bid, proj, tensor_key)
        names = [f"layers.{bid}.ffn.experts.{e}.{proj}.weight" for e in range(self.hparams["n_routed_experts"])]
        ws = [LazyTorchTensor.to_eager(self.model_tensors[n]()) for n in names]
        src_dtype = ws[0].dtype
        data = torch.stack([w.float() for w in ws]).numpy()
        qtype = gguf.GGMLQuantizationType.BF16 if src_dtype == torch.bfloat16 else gguf.GGMLQuantizationType.F32
        if qtype != gguf.GGMLQuantizationType.F32:
            data = gguf.quants.quantize(data, qtype)
        else:
            data = np.ascontiguousarray(data, dtype=np.float32)
        new_name = self.format_tensor_name(tensor_key, bid)
        self.gguf_writer.add_tensor(new_name, data, raw_dtype=qtype)
        print(f"{new_name}: stacked {len(ws)} unquantised experts as {qtype.name}", file=sys.stderr)
        return names

    cls._write_mxfp4_expert_tensor = write_expert_tensor

    original_prepare = cls.prepare_tensors

    def prepare_tensors(self):
        # keep the requested file type label (the class sets MXFP4 unconditionally)
        ftype = self.ftype
        original_prepare(self)
        if not any(k.endswith(".scale") for k in self.model_tensors):
            self.ftype = ftype
            self._is_mxfp4 = False

    cls.prepare_tensors = prepare_tensors

    script = str(lcpp / "convert_hf_to_gguf.py")
    sys.argv = [script] + sys.argv[2:]
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
