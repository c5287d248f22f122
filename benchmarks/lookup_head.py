"""A rule-lookup layer fitted into a model whose joint lines write their rules keyed.

The tiny model does not learn joint's rule lookup (BENCHMARKS.md, "Where joint's rule lookup
fails"): with keyed lines (`2. Is Kim cleared? Kim is rested. cleared: licensed and rested. no`) the
position that writes a condition holds the asked property, the prompt rule's property word (`...
is cleared.`) holds the rule's conditions, and in thousands of steps no head learns to look from one
to the other. This builds that head instead of waiting for it, from the model's own activations:

1. A residual-silent copy of the last attention layer is inserted after layer 2 (it reads what
   layer 2 wrote; `clover.training.grow`), so the grown model computes what the model computed.
2. Causal forwards over 300 joint prompts with their keyed derivations (and 75 of each other task),
   and for each response block that holds a rule copy one block-mode forward with a random share of
   it masked, as training and decoding run them, give the new layer's inputs and labels.
3. Its heads are fitted, three for the causal mode (heads 0-2) and three for block mode (4-6), one
   per thing the rule copy writes: the first condition, whether a second follows (` ` or `.`), the
   second condition. Each head's
   - **key** (ridge regression) is a code of the word at a derived property word (a regular simplex
     in the two slowest rotary pairs, which turn by less than 0.2 rad over the prompt) plus a mark
     where a prompt rule ends;
   - **query** (ridge) is the asked property's code and the mark;
   - **value** (ridge) is the key's rule: its first condition and its second (or none), one-hot;
   - **gate** (logistic regression; Qwen3.5's output gate) opens only at the head's own positions;
   - **output** columns write each condition's embedding (tied with the LM head), or ` ` against `.`.
   Then the queries, keys and q/k norms are trained for 30 passes on the attention itself (minus the
   log of the weight on the asked rule's property word, with the model's rotary embedding).

The result is a checkpoint with one more layer, to be trained on (`recipes/lookup_head_*_cpu.json`).
With `--line-rules both` the lines write the keyed rule and then its sentence (joint's `line_rules`
"both"); the heads are fitted on the keyed copy alone, and the model need not have been trained on
such lines: the shipped model's prompt rules hold their conditions at their property words, and the
asked property is the token before the keyed copy's colon. `--line-rules keyed_first` writes the keyed
copy before the fact line (joint's `line_rules` "keyed_first") and fits the heads the same way.

    python benchmarks/lookup_head.py --model runs/keyed-lines/final --out checkpoints/lookup-head-b
    python benchmarks/lookup_head.py --model checkpoints/curriculum-soup2 --out runs/both-fit --causal-only --limit 400 --line-rules both
"""

import copy
import re
import sys
from pathlib import Path

import torch

from clover.data.tasks.joint import BASE, DERIVED, LINE_RULE_FORMS, split_joined
from clover.quantization.error import layer_outputs
from clover.training.average import save_like

sys.path.insert(0, str(Path(__file__).parent))
from lookup_probe import token_at  # noqa: E402
from rule_lookups import SENTENCE, rule_copies  # noqa: E402

HEADS = ("first", "count", "second")  # what each fitted head writes: condition 1, `.`-or-more, condition 2
BLOCK_HEAD = 4  # causal positions use heads 0..2 (key-value heads 0, 0, 1), block positions 4..6 (2, 2, 3)
FITTED = (0, 1, 2, 4, 5, 6)
CODE_DIMS = (10, 22, 11, 23)  # the two slowest rotary pairs of a 24-dim head (rotate_half pairs i, i+12)
MARK_DIM = 9  # the next slowest pair's first dim: where a rule ends
CONST_DIM = 0
ALPHA = 3.0  # a key's code and mark, against 1 for the constant that every key holds
NORM_SCALE = 2.0  # the q/k norms' scale on the code and mark dims before the attention is trained
BETA = 20.0  # the output columns' norm
V_KEY_WEIGHT = 5000.0  # the value fit's weight on the keys against every other position
WORD_WEIGHT = 20.0  # the key fit's weight on the derived words against every other position
BASE_INDEX = {b: i for i, b in enumerate(BASE)}
DERIVED_INDEX = {d: i for i, d in enumerate(DERIVED)}


def simplex(n: int) -> torch.Tensor:
    """[n, n-1]: n unit vectors with pairwise cosine -1/(n-1)."""
    eye = torch.eye(n) - 1.0 / n
    basis = torch.linalg.qr(eye[:, :-1])[0]  # orthonormal basis of the centred subspace
    codes = eye @ basis
    return codes / codes.norm(dim=-1, keepdim=True)


def kv_of(attn, head: int) -> int:
    """The key-value head that query head `head` of `attn` reads (grouped-query attention); `head` may
    be a tensor of heads."""
    return head // (attn.num_heads // attn.num_kv_heads)


def word_id(tokenizer, text: str) -> int:
    """The token id of `text`, a word the tokenizer keeps whole."""
    return tokenizer(text, add_special_tokens=False).input_ids[0]


def unit_columns(vectors: torch.Tensor) -> torch.Tensor:
    """[D, N]: the rows of `vectors` [N, D] scaled to unit norm, as columns."""
    return torch.stack([v / v.norm() for v in vectors], 1)


def fit_gate(h: torch.Tensor, positive: torch.Tensor, name: str, report) -> torch.Tensor:
    """The output gate's weights [in] for one head: a logistic regression that opens it at the
    `positive` rows of `h` only (reported as `name`)."""
    gate = logistic(h, positive)
    logits = h @ gate
    report(f"gate {name}: positives {torch.sigmoid(logits[positive]).mean():.3f}, others above 0.5 "
           f"{int((logits[~positive] > 0).sum())} of {int((~positive).sum())}")
    return gate


def collect_rules(model, tokenizer, examples, layer: int, block: bool = True, seed: int = 0):
    """The rule lookup's samples (`gather`): the keys are the prompt rules' property words (label the
    property, values the rule's first and second condition, `none` the 7th second), the queries the
    positions of a keyed rule copy that write its first condition (role 0), ` ` or `.` after it (1)
    and its second condition (2), labelled with the asked property; `word` marks every derived word."""
    word_index = {word_id(tokenizer, w): i for i, w in enumerate(DERIVED)}

    def label(example, chat, ids, offsets):
        t = len(ids)
        labels = {"word": [word_index.get(i, -1) for i in ids], "key": [-1] * t, "first": [-1] * t,
                  "second": [-1] * t}
        slots = {}
        if example.task == "joint":
            for m in SENTENCE.finditer(chat.prompt.split("Facts")[0]):
                k = token_at(offsets, m.start(2))
                conds = split_joined(m[1])
                labels["key"][k] = DERIVED_INDEX[m[2]]
                labels["first"][k] = BASE_INDEX[conds[0]]
                labels["second"][k] = BASE_INDEX[conds[1]] if len(conds) > 1 else len(BASE_INDEX)
            start = len(chat.prompt) + chat.answer.index(example.reasoning)
            for a, b, prop, _, _ in rule_copies(example.reasoning):
                conds = split_joined(example.reasoning[a:b - 1])
                places = [token_at(offsets, start + a), token_at(offsets, start + a + len(conds[0]))]
                if len(conds) > 1:
                    places.append(token_at(offsets, start + a + len(conds[0]) + len(" and ")))
                for role, place in enumerate(places):
                    slots[place] = (role, DERIVED_INDEX[prop])

        def blank(masked, begin):  # a block row's labels: no key, and the derived words left unmasked
            m = len(masked)
            word = [-1 if k else w for k, w in zip(masked.tolist(), labels["word"][begin:begin + m])]
            return {"word": word, "key": [-1] * m, "first": [-1] * m, "second": [-1] * m}
        return labels, slots, blank

    return gather(model, tokenizer, examples, layer, label, block, seed)


def gather(model, tokenizer, examples, layer: int, label, block: bool = True, seed: int = 0,
           block_size: int = 32):
    """Per position of every example's causal forward (and, with `block`, of one noisy block-mode
    forward per response block that holds a slot, or per block of the other tasks, as training and
    decoding run them): the residual after `layer` (`x`), where it sits (`example`, `pos`, and
    `limit`, the keys it may see: the causal positions before `limit`), and its labels.
    `label(example, chat, ids, offsets)` gives (the causal rows' own labels, the slots: {token a
    fitted head writes: (role, query label)}, and `blank(masked, begin)`: a block's own labels).
    A causal position predicts the next token, so a slot's query is the token before it (head =
    role); a masked block position predicts its own token (head = `BLOCK_HEAD` + role)."""
    from clover.data.corpus import format_chat

    gen = torch.Generator().manual_seed(seed)
    rows = {}
    for n, example in enumerate(examples):
        chat = format_chat(tokenizer, example, enable_thinking=True)
        enc = tokenizer(chat.prompt + chat.answer, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc.input_ids, [tuple(s) for s in enc["offset_mapping"]]
        t = len(ids)
        labels, slots, blank = label(example, chat, ids, offsets)
        query, head = [-1] * t, [-1] * t
        for slot, (role, asked) in slots.items():
            query[slot - 1], head[slot - 1] = asked, role
        outputs, _ = layer_outputs(model, torch.tensor([ids]))
        _add(rows, x=outputs[layer][0], example=[n] * t, pos=list(range(t)), limit=list(range(1, t + 1)),
             query=query, head=head, **labels)
        for begin in range(token_at(offsets, len(chat.prompt)), t, block_size) if block else ():
            end = min(begin + block_size, t)
            inside = [s for s in slots if begin <= s < end]
            if example.task == "joint" and not inside:
                continue
            level = 0.1 + 0.9 * torch.rand((), generator=gen).item()
            masked = torch.rand(end - begin, generator=gen) < level
            masked[[s - begin for s in inside]] = True
            block_ids = torch.tensor(ids[begin:end]).masked_fill(masked, model.config.mask_token_id)
            outputs, _ = layer_outputs(model, torch.cat([torch.tensor(ids[:begin]), block_ids])[None],
                                       block_len=end - begin)
            m = end - begin
            query, head = [-1] * m, [-1] * m
            for s in inside:
                role, asked = slots[s]
                head[s - begin], query[s - begin] = BLOCK_HEAD + role, asked
            _add(rows, x=outputs[layer][0, -m:], example=[n] * m, pos=list(range(begin, end)), limit=[begin] * m,
                 query=query, head=head, **blank(masked, begin))
        if n % 50 == 49:
            print(f"collected {n + 1}/{len(examples)} examples", flush=True)
    return {k: torch.cat(v) for k, v in rows.items()}


def _add(rows: dict, **columns) -> None:
    for name, values in columns.items():
        rows.setdefault(name, []).append(torch.as_tensor(values))


def ridge(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None, lam: float = 1e-2) -> torch.Tensor:
    """W [out, in] minimizing sum w (x W^T - y)^2 + lam |W|^2."""
    w = torch.ones(len(x)) if weight is None else weight
    xw = x * w[:, None]
    a = x.T @ xw + lam * len(x) * torch.eye(x.shape[1]) / x.shape[1]
    return torch.linalg.solve(a, xw.T @ y).T


@torch.enable_grad()
def logistic(x: torch.Tensor, y: torch.Tensor, steps: int = 400) -> torch.Tensor:
    """w [in] of a logistic regression without bias (positives up-weighted to balance)."""
    w = torch.zeros(x.shape[1], requires_grad=True)
    pos = y.float().mean()
    weight = torch.where(y, 0.5 / pos, 0.5 / (1 - pos))
    opt = torch.optim.Adam([w], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y.float(), reduction="none") * weight).mean()
        loss.backward()
        opt.step()
    return w.detach()


@torch.no_grad()
def fit_rule_layer(model, tokenizer, data, new: int, alpha: float = ALPHA, norm_scale: float = NORM_SCALE,
                   beta: float = BETA, report=print) -> list[float]:
    """Fit the rule heads (`HEADS`; causal 0-2, block 4-6 where `data` has block rows) into layer
    `new`, an attention layer whose writes are zero, from `collect_rules`' samples (see the module
    docstring), then train their attention (`sharpen`, whose history this returns). Every other head
    is left silent: zero queries, keys, values and outputs."""
    layer = model.model.layers[new]
    attn = layer.self_attn
    d = attn.head_dim
    h = layer.input_layernorm(data["x"]).float()
    codes = simplex(len(DERIVED))  # [5, 4]
    code_dims = list(CODE_DIMS)

    # keys: every derived word carries its code (its identity), and the prompt rule's property word
    # also a mark (where a rule ends); queries carry the asked code and a constant that reads the mark
    word = data["word"]
    is_word, is_key = word >= 0, data["key"] >= 0
    k_target = torch.zeros(len(h), 6)
    k_target[is_word, :4] = alpha * codes[word[is_word]]
    k_target[is_key, 4] = alpha
    k_target[:, 5] = 1.0
    wk = ridge(h, k_target, torch.where(is_word, WORD_WEIGHT, 1.0))
    k_fit = h @ wk.T
    report(f"key: code error on words {(k_fit[is_word, :4] - k_target[is_word, :4]).norm(dim=-1).mean():.3f}, "
           f"others {k_fit[~is_word, :4].norm(dim=-1).mean():.3f} (code norm {alpha}); mark on keys "
           f"{k_fit[is_key, 4].mean():.2f}, on other words {k_fit[is_word & ~is_key, 4].mean():.2f} ± "
           f"{k_fit[is_word & ~is_key, 4].std():.2f}, elsewhere {k_fit[~is_word, 4].abs().mean():.2f}; "
           f"const {k_fit[:, 5].mean():.2f} ± {k_fit[:, 5].std():.2f}")
    # queries: the line's position carries its asked property's code
    fitted = [head for head in FITTED if (data["head"] == head).any()]  # block heads: only with block rows
    wq = {}
    for mode, is_query in (("causal", (data["head"] >= 0) & (data["head"] < BLOCK_HEAD)),
                           ("block", data["head"] >= BLOCK_HEAD)):
        if not is_query.any():
            continue
        q_target = torch.cat([codes[data["query"][is_query]], torch.ones(int(is_query.sum()), 1)], 1)
        wq[mode] = ridge(h[is_query], q_target)
        q_fit = (h[is_query] @ wq[mode].T)[:, :4]
        right = ((q_fit @ codes.T).argmax(-1) == data["query"][is_query]).float().mean()
        report(f"query code, {mode}: nearest right {right:.3f} of {int(is_query.sum())}")
    # values: the key's conditions, first (6) then second or none (7)
    n_base = len(BASE)
    v_target = torch.zeros(len(h), 2 * n_base + 1)  # zero wherever no rule ends
    v_target[is_key.nonzero()[:, 0], data["first"][is_key]] = 1.0
    v_target[is_key.nonzero()[:, 0], n_base + data["second"][is_key]] = 1.0
    wv = ridge(h, v_target, torch.where(is_key, V_KEY_WEIGHT, 1.0))
    v_all = h @ wv.T
    report(f"value off the keys: {v_all[~is_key].norm(dim=-1).mean():.3f}")
    v_fit = v_all[is_key]
    report(f"value: first right {(v_fit[:, :n_base].argmax(-1) == data['first'][is_key]).float().mean():.3f}, "
           f"second right {(v_fit[:, n_base:].argmax(-1) == data['second'][is_key]).float().mean():.3f} "
           f"of {int(is_key.sum())} keys")

    q_rows = torch.zeros(attn.num_heads, 2 * d, h.shape[1])
    k_rows = torch.zeros(attn.num_kv_heads, d, h.shape[1])
    v_rows = torch.zeros(attn.num_kv_heads, d, h.shape[1])
    for kv in sorted({kv_of(attn, head) for head in fitted}):
        k_rows[kv, code_dims] = wk[:4]
        k_rows[kv, MARK_DIM] = wk[4]
        k_rows[kv, CONST_DIM] = wk[5]
        v_rows[kv, :2 * n_base + 1] = wv
    o = torch.zeros(h.shape[1], attn.num_heads, d)
    emb = model.model.embed_tokens.weight.float()
    base_ids = [word_id(tokenizer, b) for b in BASE]
    space, stop = (word_id(tokenizer, s) for s in (" ", "."))
    conditions_out = beta * unit_columns(emb[base_ids] - emb[base_ids].mean(0))  # [hidden, 6]
    more = unit_columns((emb[space] - emb[stop])[None])  # [hidden, 1]: ` ` against `.`
    for head in fitted:
        name, mode = HEADS[head % BLOCK_HEAD], "block" if head >= BLOCK_HEAD else "causal"
        q_rows[head, code_dims] = wq[mode][:4]
        q_rows[head, MARK_DIM] = wq[mode][4]
        q_rows[head, d:] = fit_gate(h, data["head"] == head, f"{name}, {mode}", report)
        if name == "first":
            o[:, head, :n_base] = conditions_out
        elif name == "count":
            o[:, head, n_base:2 * n_base] = beta * more
            o[:, head, 2 * n_base] = -beta * more[:, 0]
        else:
            o[:, head, n_base:2 * n_base] = conditions_out
    attn.q_proj.weight.copy_(q_rows.reshape(-1, h.shape[1]))
    attn.k_proj.weight.copy_(k_rows.reshape(-1, h.shape[1]))
    attn.v_proj.weight.copy_(v_rows.reshape(-1, h.shape[1]))
    attn.o_proj.weight.copy_(o.reshape(h.shape[1], -1))
    attn.q_norm.weight.zero_()
    attn.k_norm.weight.zero_()
    attn.q_norm.weight[code_dims + [MARK_DIM]] = norm_scale - 1
    attn.k_norm.weight[code_dims + [MARK_DIM]] = norm_scale - 1
    return sharpen(model, new, data, h, report)


@torch.enable_grad()
def sharpen(model, new: int, data, h: torch.Tensor, report=print, epochs: int = 30, lr: float = 3e-3) -> list[float]:
    """Train the fitted heads' query and key projections (and the q/k norms) so that each query
    position's attention lands on the key its label names (the asked rule's property word, the
    pilot's fact line): the loss is minus the log of the weight there, over the causal positions the
    query may see, with the model's rotary embedding. Returns each pass's mean weight on the named
    key (measured as the pass goes)."""
    from clover.model.attention import apply_rotary

    attn = model.model.layers[new].self_attn
    d = attn.head_dim
    wq = attn.q_proj.weight.view(attn.num_heads, 2 * d, -1)[:, :d].detach().clone().requires_grad_()
    wk = attn.k_proj.weight.view(attn.num_kv_heads, d, -1).detach().clone().requires_grad_()
    q_norm, k_norm = copy.deepcopy(attn.q_norm), copy.deepcopy(attn.k_norm)  # trained, then copied back
    opt = torch.optim.Adam([wq, wk, q_norm.weight, k_norm.weight], lr=lr)
    jobs = []  # per example: its causal rows, its queries with their heads, key-value heads and rotary, targets
    for n in data["example"].unique().tolist():
        mine = data["example"] == n
        causal = mine & (data["limit"] == data["pos"] + 1)  # the causal rows, one per position, in order
        queries = (mine & (data["head"] >= 0)).nonzero()[:, 0]
        if len(queries):
            keys = data["key"][causal]
            target = keys[None] == data["query"][queries][:, None]  # [Q, T]
            allowed = torch.arange(len(keys))[None] < data["limit"][queries][:, None]
            heads = data["head"][queries]
            cos, sin = model.model.rotary_emb(torch.arange(len(keys))[None], h.dtype)  # [1, T, R]
            at = data["pos"][queries]
            jobs.append((causal.nonzero()[:, 0], queries, heads, kv_of(attn, heads),
                         (cos, sin), (cos[:, at], sin[:, at]), target, allowed))
    history = []
    for epoch in range(epochs):
        total, right = 0.0, 0.0
        for columns, queries, heads, kvs, key_rotary, query_rotary, target, allowed in jobs:
            k = k_norm(torch.einsum("hdc,tc->htd", wk, h[columns]))  # [H_kv, T, D]
            k = apply_rotary(k[None], *key_rotary)[0]
            q = q_norm(torch.einsum("qdc,qc->qd", wq[heads], h[queries]))  # [Q, D]
            q = apply_rotary(q[None, None], *query_rotary)[0, 0]
            ks = k[kvs]  # [Q, T, D]
            scores = torch.einsum("qd,qtd->qt", q, ks) * d ** -0.5
            logp = scores.masked_fill(~allowed, float("-inf")).log_softmax(-1)
            loss = -torch.logsumexp(logp.masked_fill(~target, float("-inf")), -1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(queries)
            right += logp.exp().masked_fill(~target, 0).sum(-1).sum().item()
        n = sum(len(j[1]) for j in jobs)
        history.append(right / n)
        if epoch % 5 == 4 or epoch == epochs - 1:
            report(f"sharpen epoch {epoch + 1}: loss {total / n:.3f}, weight on the asked key {right / n:.3f}")
    with torch.no_grad():
        q_view = attn.q_proj.weight.view(attn.num_heads, 2 * d, -1)
        q_view[:, :d] = wq
        attn.k_proj.weight.copy_(wk.reshape(attn.k_proj.weight.shape))
        attn.q_norm.weight.copy_(q_norm.weight)
        attn.k_norm.weight.copy_(k_norm.weight)
    return history


_FACT = r"(\w+) (?:(?:is |[1-3] )(.+?)|has none of these|0)\."  # stated, or counted (`Kim 2 a and b.`, `Kim 0.`)
FACT_LINE = re.compile(rf"^{_FACT}$", re.MULTILINE)  # a prompt fact line
FACT_COPY = re.compile(rf"\? {_FACT}")  # a derivation line's copy of one
FACT_ROLES = ("property", "verb")  # a fact head writes the pilot's properties, or `is` against `has`


def collect_facts(model, tokenizer, examples, layer: int, block: bool = True, seed: int = 0):
    """The fact lookup's samples (`gather`): the keys are the prompt fact lines' full stops (label the
    pilot's place among the fact lines, `value` its properties, `none` the 7th), the queries a
    derivation line's positions that write the pilot's verb (`is` or `has`, role 1) or one of its
    properties (role 0), labelled with the pilot's place."""

    def label(example, chat, ids, offsets):
        t = len(ids)
        key, value, slots = [-1] * t, torch.zeros(t, len(BASE) + 1), {}
        if example.task == "joint":
            pilots = {}
            for m in FACT_LINE.finditer(chat.prompt, chat.prompt.index("Facts"), chat.prompt.index("Questions:")):
                stop = token_at(offsets, m.end() - 1)
                pilots[m[1]] = key[stop] = len(pilots)
                for prop in split_joined(m[2]) if m[2] else []:
                    value[stop, BASE_INDEX[prop]] = 1.0
                value[stop, len(BASE)] = float(not m[2])
            start = len(chat.prompt) + chat.answer.index(example.reasoning)
            for m in FACT_COPY.finditer(example.reasoning):
                slots[token_at(offsets, start + m.end(1) + 1)] = (1, pilots[m[1]])
                words = re.finditer(r"\w+", m[2] or "")
                slots.update({token_at(offsets, start + m.start(2) + k.start()): (0, pilots[m[1]])
                              for k in words if k[0] != "and"})
        return {"key": key, "value": value}, slots, lambda masked, _: {
            "key": [-1] * len(masked), "value": torch.zeros(len(masked), len(BASE) + 1)}

    return gather(model, tokenizer, examples, layer, label, block, seed)


@torch.no_grad()
def fit_fact_layer(model, tokenizer, data, new: int, beta: float = BETA, report=print, epochs: int = 60):
    """Fit the fact heads into layer `new` (see `collect_facts`): causal heads 0 (properties) and 1
    (verb) on key-value head 0, block heads 4 and 5 on key-value head 2. The queries and keys start
    as the copied layer's and are trained on the attention (`sharpen`), the values (ridge) hold the
    pilot's properties at its fact line's full stop, the gates (logistic) open at each head's own
    positions, and the outputs write the held properties' embeddings (role 0) or `has` against `is`
    (role 1)."""
    layer = model.model.layers[new]
    attn = layer.self_attn
    d, hidden = attn.head_dim, model.config.hidden_size
    h = layer.input_layernorm(data["x"]).float()
    is_key = data["key"] >= 0
    wv = ridge(h[is_key], data["value"][is_key], lam=1e-3)  # the attention is sharp: the keys alone
    held = (h[is_key] @ wv.T) > 0.5
    report(f"value: the pilot's whole set right {(held == data['value'][is_key].bool()).all(-1).float().mean():.3f}"
           f" of {int(is_key.sum())} fact lines")
    v_rows = attn.v_proj.weight.view(attn.num_kv_heads, d, hidden)
    v_rows.zero_()
    fitted = [head for head in (0, 1, BLOCK_HEAD, BLOCK_HEAD + 1) if (data["head"] == head).any()]
    for kv in sorted({kv_of(attn, head) for head in fitted}):
        v_rows[kv, :len(BASE) + 1] = wv
    emb = model.model.embed_tokens.weight.float()
    base_ids = [word_id(tokenizer, b) for b in BASE]
    properties_out = beta * unit_columns(emb[base_ids] - emb[base_ids].mean(0))  # [hidden, 6]
    has = unit_columns((emb[word_id(tokenizer, "has")] - emb[word_id(tokenizer, "is")])[None])  # [hidden, 1]
    q_rows = attn.q_proj.weight.view(attn.num_heads, 2 * d, hidden)
    o = torch.zeros(hidden, attn.num_heads, d)
    for head in fitted:
        role = FACT_ROLES[head % BLOCK_HEAD]
        q_rows[head, d:] = fit_gate(h, data["head"] == head,
                                    f"{role}, {'block' if head >= BLOCK_HEAD else 'causal'}", report)
        if role == "property":
            o[:, head, :len(BASE)] = properties_out
        else:
            o[:, head, :len(BASE)] = -beta / 2 * has
            o[:, head, len(BASE)] = beta * has[:, 0]
    attn.o_proj.weight.copy_(o.reshape(hidden, -1))
    return sharpen(model, new, data, h, report, epochs=epochs)


def main() -> None:
    import argparse

    from clover.data import eval_examples, get_task
    from clover.loading import load_model_and_tokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a checkpoint folder whose joint lines write keyed rules")
    parser.add_argument("--out", required=True, help="the grown checkpoint folder to write")
    parser.add_argument("--limit", type=int, default=300, help="joint prompts to fit on (a quarter as many of each other task)")
    parser.add_argument("--lookup", choices=("rules", "facts"), default="rules",
                        help="the lookup the new layer makes: a rule by its property, or a fact line by its pilot")
    parser.add_argument("--causal-only", action="store_true",
                        help="fit the causal heads only (no block-mode forwards, no block heads)")
    parser.add_argument("--beta", type=float, default=BETA, help="the norm of the fitted heads' output columns")
    parser.add_argument("--seed", type=int, default=50, help="the prompts' split seed (no evaluation uses it)")
    parser.add_argument("--line-rules", choices=[f for f in LINE_RULE_FORMS if f != "sentence"], default="keyed",
                        help="how joint's lines write the rule they look up: keyed, keyed then as a sentence, "
                             "or keyed before the fact line and as a sentence after it")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(args.model)
    model, new = with_silent_layer(model.float().eval())
    joint = eval_examples(args.limit, seed=args.seed, tasks=[get_task("joint", line_rules=args.line_rules)])
    others = eval_examples(args.limit // 4, seed=args.seed, tasks=[get_task(n) for n in ("airspace", "record", "copy")])
    block = not args.causal_only
    if args.lookup == "rules":
        data = collect_rules(model, tokenizer, joint + others, new - 1, block)
        fit_rule_layer(model, tokenizer, data, new, beta=args.beta)
    else:
        data = collect_facts(model, tokenizer, joint + others, new - 1, block)
        fit_fact_layer(model, tokenizer, data, new, beta=args.beta)
    save_like(model, args.model, args.out)
    print(f"wrote {args.out}: {args.model} with a fitted {args.lookup} lookup layer at index {new}")


def with_silent_layer(model) -> tuple[object, int]:
    """(`model` with a residual-silent copy of its last layer, an attention layer, inserted right
    before it, the copy's index): the copy reads what the layer before it wrote."""
    from clover.training.grow import grow_layers

    new = len(model.model.layers) - 1
    model = grow_layers(model, [new])  # the copy comes after the last layer ...
    layers = model.model.layers
    layers[new], layers[new + 1] = layers[new + 1], layers[new]  # ... and goes before it: both are attention
    return model, new


if __name__ == "__main__":
    main()
