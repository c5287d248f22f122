"""Left padding never changes a row's result (fp32, atol 1e-5: only batch shapes differ):
padded batch rows against unpadded single-row runs, causal and block mode, with a cache."""

import torch

from tiny import tiny_model

MASK, BLOCK = 127, 4


def run(model, prompt, steps, mask=None):
    """Prefill, then `steps` of (tokens, block_len); returns each call's logits and the cache.
    `mask` covers the prompt (None: no padding); it grows by the tokens each call caches."""
    cache = model.new_cache()
    cached = mask if mask is not None else torch.ones_like(prompt)
    outs = []
    with torch.no_grad():
        outs.append(model(prompt, attention_mask=cached, past_key_values=cache).logits)
        for tokens, block_len in steps:
            new = torch.ones_like(tokens)
            outs.append(model(tokens, attention_mask=torch.cat((cached, new), 1), past_key_values=cache,
                              block_len=block_len).logits)
            cached = torch.cat((cached, new[:, :tokens.shape[1] - block_len]), 1)  # block tokens are not cached
    return outs, cache


def test_left_padding_does_not_change_any_row():
    model = tiny_model()
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 9, 2]
    prompts = [torch.randint(0, MASK, (1, n), generator=gen) for n in lengths]
    width = max(lengths)
    padded = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        padded[row, width - p.shape[1]:] = p[0]
        mask[row, width - p.shape[1]:] = 1
    block = torch.full((3, BLOCK), MASK)
    block[:, 1] = torch.randint(0, MASK, (3,), generator=gen)
    finished = torch.randint(0, MASK, (3, BLOCK), generator=gen)
    steps = [(block, BLOCK), (torch.cat((finished, block), 1), BLOCK), (block, BLOCK), (finished[:, :2], 0)]

    batch_outs, batch_cache = run(model, padded, steps, mask)
    for row, p in enumerate(prompts):
        single_steps = [(tokens[row:row + 1], block_len) for tokens, block_len in steps]
        single_outs, single_cache = run(model, p, single_steps)
        n = p.shape[1]
        torch.testing.assert_close(batch_outs[0][row:row + 1, width - n:], single_outs[0], rtol=0, atol=1e-5)
        for got, want in zip(batch_outs[1:], single_outs[1:]):
            torch.testing.assert_close(got[row:row + 1], want, rtol=0, atol=1e-5)
        for layer_b, layer_s in zip(batch_cache.layers, single_cache.layers):
            if hasattr(layer_b, "key"):  # attention: the row's real positions only
                for name in ("key", "value"):
                    torch.testing.assert_close(getattr(layer_b, name)[row:row + 1, :, width - n:],
                                               getattr(layer_s, name), rtol=0, atol=1e-5)
            else:
                for name in ("conv_state", "recurrent_state"):
                    torch.testing.assert_close(getattr(layer_b, name)[row:row + 1], getattr(layer_s, name),
                                               rtol=0, atol=1e-5)
