"""Run in a subprocess by test_decoding_long_prompt: prefill a long prompt, print peak RSS growth.

ru_maxrss is the process high-water mark, so the delta over the baseline taken just before
decoding is the peak extra host memory of the decode."""

import json
import resource
import sys
import time

import torch

from tiny import tiny_model


def main(length: int, chunk: int, threads: int) -> None:
    torch.set_num_threads(threads)
    model = tiny_model(max_position_embeddings=40_000, num_hidden_layers=2,
                       layer_types=["linear_attention", "full_attention"], num_experts=4)
    ids = torch.randint(8, 120, (1, length), generator=torch.Generator().manual_seed(0))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=4, block_size=4, prefill_chunk_size=chunk,
                         eos_token_id=[], return_dict_in_generate=True)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps(dict(length=length, chunk=chunk, peak_mib=round(peak / 1024, 1),
                          seconds=round(seconds, 2),
                          forwards=out.num_forward_passes, prefill_forwards=out.num_prefill_forwards,
                          new_tokens=out.rows[0].new_tokens)))


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]))
