"""What dualk.fuse finds in transformers' architectures (CPU, tiny random configs, fp32): per
model type, the chains fused, the Linears left alone, whether the fused model gives the
original's outputs, and the first reason a layer's MLP was not fused. A survey of coverage
("fuses nothing" models), not of speed.

    python experiments/fuse_survey_transformers.py [--types llama,gpt2,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import platform
import warnings

import torch

import dualk

# Small sizes under the names the configs use (each config takes the ones it knows).
SMALL = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, n_embd=64, n_layer=1,
    n_head=4, n_inner=128, n_positions=64, d_model=64, d_ff=128, num_layers=1, num_heads=4,
    d_kv=16, ffn_dim=128, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, image_size=32,
    patch_size=8, num_channels=3, moe_intermediate_size=64, num_experts=4, num_local_experts=4,
    num_experts_per_tok=2, shared_expert_intermediate_size=64, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, decoder_start_token_id=1, rotary_dim=8, expansion_ratio=2,
    num_mel_bins=16, max_source_positions=16, max_target_positions=16,
)  # fmt: skip
TYPES = (
    "llama,mistral,qwen2,qwen3,gemma,gemma2,gemma3_text,phi3,phi,glm,helium,olmo,stablelm,"
    "granite,cohere,smollm3,exaone4,llama4_text,qwen2_moe,mixtral,gpt2,gpt_bigcode,gptj,"
    "codegen,gpt_neox,starcoder2,mpt,bloom,opt,biogpt,xglm,nemotron,persimmon,bert,roberta,"
    "electra,deberta-v2,distilbert,mpnet,ernie,modernbert,albert,t5,bart,mbart,whisper,vit,"
    "dinov2,clip_text_model"
)
ENCODER_DECODER = ("t5", "bart", "mbart", "whisper")
PIXELS = ("vit", "dinov2")


def inputs_for(model_type: str) -> dict:
    g = torch.Generator().manual_seed(0)
    if model_type in PIXELS:
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)}
    ids = torch.randint(3, 128, (2, 8), generator=g)
    if model_type == "whisper":
        return {
            "input_features": torch.randn(2, 16, 32, generator=g),
            "decoder_input_ids": ids[:, :4],
        }
    if model_type in ENCODER_DECODER:
        return {"input_ids": ids, "decoder_input_ids": ids}
    return {"input_ids": ids}


def survey(model_type: str) -> dict:
    from transformers import AutoConfig, AutoModel

    row: dict = {"type": model_type}
    try:
        config = AutoConfig.for_model(model_type)
        for key, value in SMALL.items():  # (only those the config has: some are properties)
            if hasattr(config, key):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(config, key, value)
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        model = AutoModel.from_config(config).eval()
        x = inputs_for(model_type)
        with torch.no_grad():
            want = model(**x)[0]
    except Exception as exc:  # the survey's config, not dualk
        row["error"] = f"model: {type(exc).__name__}: {str(exc)[:160]}"
        return row
    row["model"] = type(model).__name__
    try:
        fused, rep = dualk.fuse(model, report=True)
        runs: list = []  # the fused modules that ran in the call (a fused one may never run:
        # ALBERT's layers get position_ids through **kwargs, which their fused graph does not take)
        fused_types = (dualk.nn.FusedMLP, dualk.nn.LinearGELU, dualk.nn.GatedBase)
        for m in fused.modules():
            if isinstance(m, fused_types):
                m.register_forward_pre_hook(lambda mod, args: runs.append(mod))
        with torch.no_grad():
            got = fused(**x)[0]
    except Exception as exc:
        row["error"] = f"fuse: {type(exc).__name__}: {str(exc)[:200]}"
        return row
    row["max_abs_err"] = float((got - want).abs().max())
    row["fused"] = [f"{c.kind}({'-'.join(map(str, c.widths))}, {c.activation})" for c in rep.fused]
    row["fused_ran"] = len({id(m) for m in runs})
    row["not_fused"] = len(rep.skipped)
    mlp_words = ("mlp", "ffn", "feed_forward", "intermediate", "fc1", "c_fc", "dense_h_to_4h")
    notes = [n for n in rep.notes if "not traceable" in n and any(w in n for w in mlp_words)]
    skipped = [
        f"{s.where}: {s.reason}" for s in rep.skipped if any(w in s.where for w in mlp_words)
    ]
    row["why_not"] = (notes + skipped)[:1]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default=TYPES)
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    rows = []
    for model_type in args.types.split(","):
        with contextlib.redirect_stderr(io.StringIO()):
            row = survey(model_type)
        rows.append(row)
        if "error" in row:
            print(f"{model_type:16s} ERROR {row['error']}")
            continue
        kinds = sorted({f.split("(")[0] for f in row["fused"]})
        why = row["why_not"][0][:150] if row["why_not"] and not row["fused"] else ""
        print(f"{model_type:16s} fused {len(row['fused']):2d} ran {row['fused_ran']:2d} "
              f"{','.join(kinds):22s} err {row['max_abs_err']:.1e}  {why}")  # fmt: skip
    if args.json:
        meta = {
            "date": datetime.date.today().isoformat(), "device": "cpu",
            "host": platform.processor() or platform.machine(), "torch": torch.__version__,
            "transformers": transformers.__version__,
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
