#!/usr/bin/env python3
"""Lab helper: make a tiny random-weight Llama model that vLLM (CPU) can serve, without any hub.

Output (cached, made once): ${PD_LAB_CACHE:-~/.cache/pd-lab}/tiny-llama/
  config.json, generation_config.json, model.safetensors,
  tokenizer.json, tokenizer_config.json (with a chat_template), special_tokens_map.json

Model: LlamaForCausalLM, hidden 256, 4 heads (head_dim 64; head_dim 16 crashes vLLM's CPU
attention kernel), 2 layers, intermediate 512, max_position_embeddings 4096, vocab 1024.
Tokenizer: byte-level BPE (1024 tokens) trained with `tokenizers` on text found on local disk
(Python's stdlib sources and docs). Random weights: outputs are gibberish, by design.

Needs torch, transformers, tokenizers, safetensors. If the running interpreter lacks them, the
script makes ${PD_LAB_CACHE}/venv-tools offline from the lab wheelhouse (build-wheelhouse.sh
first) and re-runs itself there:
  python3 -m venv V && V/bin/pip install --no-index -f WH torch transformers tokenizers safetensors
Usage: make-tiny-model.py [--out DIR] [--force]
"""
import argparse
import glob
import json
import os
import sys
import sysconfig
import time

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]


def corpus_files(limit_bytes=8 << 20):
    """Local text: Python stdlib sources, then any docs under /usr/share/doc."""
    roots = [sysconfig.get_paths()["stdlib"], "/usr/lib/python3.11", "/usr/share/doc"]
    files, total = [], 0
    for root in roots:
        for pattern in ("**/*.py", "**/*.txt", "**/*.md", "**/*.rst"):
            for f in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
                try:
                    size = os.path.getsize(f)
                except OSError:
                    continue
                if size == 0 or size > 1 << 20:
                    continue
                files.append(f)
                total += size
                if total >= limit_bytes:
                    return files
    if not files:
        sys.exit("no local text found to train the tokenizer on")
    return files


def build_tokenizer(vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def lines():
        for f in corpus_files():
            try:
                with open(f, encoding="utf-8", errors="ignore") as fh:
                    yield fh.read()
            except OSError:
                continue

    tok.train_from_iterator(lines(), trainer=trainer)
    return tok


def ensure_deps(cache):
    """Re-exec in a tools venv made offline from the wheelhouse when imports are missing."""
    try:
        import tokenizers, torch, transformers, safetensors  # noqa: F401
        return
    except ImportError:
        pass
    import subprocess
    venv = os.path.join(cache, "venv-tools")
    py = os.path.join(venv, "bin", "python")
    # By prefix: a venv's python is a link to the same interpreter as any other venv's, so the executables' real
    # paths cannot tell the tools venv from the caller's.
    if os.path.realpath(sys.prefix) == os.path.realpath(venv) or os.environ.get("PD_LAB_TOOLS_VENV"):
        sys.exit("torch/transformers/tokenizers missing even in " + venv)
    wh = os.environ.get("PD_LAB_WHEELHOUSE", os.path.join(cache, "wheelhouse"))
    if not os.path.isdir(wh):
        sys.exit(f"no wheelhouse at {wh}: run scripts/lab/build-wheelhouse.sh first")
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    subprocess.check_call([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", wh,
                           "torch", "transformers", "tokenizers", "safetensors"], env=env)
    os.environ["PD_LAB_TOOLS_VENV"] = venv
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


def main():
    cache = os.environ.get("PD_LAB_CACHE", os.path.expanduser("~/.cache/pd-lab"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(cache, "tiny-llama"))
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    done = os.path.join(args.out, ".complete")
    if os.path.exists(done) and not args.force:
        print(args.out)
        return
    t0 = time.time()
    ensure_deps(cache)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = build_tokenizer(args.vocab_size)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        model_max_length=4096,
    )
    hf_tok.chat_template = CHAT_TEMPLATE

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32).eval()

    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    hf_tok.save_pretrained(args.out)
    # Make sure the chat template is in tokenizer_config.json (newer transformers may
    # write it to chat_template.jinja instead; vLLM reads either, keep both).
    tc_path = os.path.join(args.out, "tokenizer_config.json")
    with open(tc_path) as fh:
        tc = json.load(fh)
    if "chat_template" not in tc:
        tc["chat_template"] = CHAT_TEMPLATE
        with open(tc_path, "w") as fh:
            json.dump(tc, fh, indent=2)

    # Sanity: reload with transformers and run one forward pass.
    from transformers import AutoModelForCausalLM, AutoTokenizer
    t2 = AutoTokenizer.from_pretrained(args.out)
    m2 = AutoModelForCausalLM.from_pretrained(args.out)
    ids = t2.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                 return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        m2(ids)
    # Readable by the non-root service users in the containers (bind-mounted read-only).
    for name in os.listdir(args.out):
        os.chmod(os.path.join(args.out, name), 0o644)
    os.chmod(args.out, 0o755)
    with open(done, "w") as fh:
        fh.write("ok\n")
    n = sum(p.numel() for p in model.parameters())
    print(f"made {args.out}: {n} params, vocab {len(hf_tok)}, {time.time() - t0:.1f} s", file=sys.stderr)
    print(args.out)


if __name__ == "__main__":
    main()
