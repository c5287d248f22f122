"""Line-owner supervision: every token of a fact line is made to carry the line's pilot.

Joint's wrong fact-line copies follow the words just written into another pilot's line (`Mia is
licensed` + `.` from `Fay is licensed.`, `benchmarks/fact_copies.py`): a copy that matches the
previous word cannot tell two lines that share it. Linear probes find the pilot held at a line's
first property and at chance at every later token, in every layer (`benchmarks/owner_probe.py`).
A copy that matches the pilot too needs it at the tokens its keys are read from (the prompt's line)
and at its query (the derivation's copy).

This loss asks for it. A fact line is a pilot's name followed by ` is` or ` has` (`Hal is insured
and rested.`, `Leo has none of these.`), in the prompt or in the response; its owned tokens run
from the token after the name to the line's full stop, included. The residual stream after decoder
layer `layer` is read at each owned token (of the clean stream: the causal rows of the training
forwards, no extra forward) and asked for the line's pilot by a readout that adds no parameter, so
checkpoints, resumption and export are unchanged (`OWNER_READOUTS`):

- `"embedding"`: scored against every pilot's name by cosine similarity with the name's input
  embedding (detached: the loss moves the residual stream, not the names), times `SCALE`; the loss
  is the cross-entropy of the line's pilot. The name's embedding is what its token writes into the
  residual stream, so carrying it forward is the plain way. From the embedded model, after layer 0
  (GDN) it is not learned in 700 steps; after layer 1 (the first full attention, which can look back
  at the name) a linear probe finds the pilot at every token of the list by step 1,000, and the
  fact-line copies still follow the shared word (BENCHMARKS.md, "Line-owner supervision").
- `"ridge"`: what a linear probe measures. The batch's examples are split in two (even and odd
  rows); on each half a ridge regression from the standardized residuals to the pilot's one-hot
  is fitted in closed form (detached, `RIDGE` times the tokens as its penalty) and scored on the
  other half's tokens; the loss is the mean squared error of those predictions. Any direction that
  holds the pilot serves; the gradient moves the held-out residuals along the directions the other
  half's fit reads. Measured, those directions are noise at the start: the loss stays at chance.

Other targets (`OWNER_TARGETS`), read the same way against the properties' embeddings:
`"asked"` (`AskedTokens`) asks each token of a derivation line, after its question, for the property
the question asks: what the lookup of its rule matches. `"rule_first"` (`RuleFirstTokens`) asks a
rule sentence's property word (`cleared` in `Anyone who is licensed and rested is cleared.`) for the
rule's first condition (`licensed`): what a head that looks the rule up there reads, and what the
copy writes next.
"""

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .copy_attention import first_index, full_stops, opened_sentences, single_tokens
from .data import Batch

SCALE = 10.0  # cosine similarity -> logit: a 0.3 lead over the next name is a 3-nat margin
RIDGE = 1.0  # the ridge penalty per fitted token, on standardized residuals (0.3 overfits 150 tokens)
OWNER_READOUTS = ("embedding", "ridge")


@dataclass(frozen=True)
class OwnerTokens:
    """Token ids of fact lines: each pilot's name (its class is its position), the words that
    start a line after the name, the space between them, and the full stops that end it."""

    names: tuple[int, ...]
    verbs: frozenset[int]
    space: int
    stops: frozenset[int]

    @property
    def classes(self) -> tuple[int, ...]:
        """The token ids whose embeddings the owned tokens are scored against, by class."""
        return self.names

    def owners(self, ids: list[int]) -> list[int]:
        return line_owners(ids, self)


@dataclass(frozen=True)
class AskedTokens:
    """Token ids of derivation lines: each property (its class is its position), the question mark
    that ends a question in the response, and the tokens that hold a newline (a line's end)."""

    properties: tuple[int, ...]
    ask: int
    newlines: frozenset[int]

    @property
    def classes(self) -> tuple[int, ...]:
        return self.properties

    def owners(self, ids: list[int]) -> list[int]:
        return asked_owners(ids, self)


@dataclass(frozen=True)
class RuleFirstTokens:
    """Token ids of rule sentences: each property (its class is its position), the word that opens a
    rule, and the full stops that end it."""

    properties: tuple[int, ...]
    opener: int
    stops: frozenset[int]

    @property
    def classes(self) -> tuple[int, ...]:
        return self.properties

    def owners(self, ids: list[int]) -> list[int]:
        return rule_first_owners(ids, self)


TargetTokens = OwnerTokens | AskedTokens | RuleFirstTokens  # what the owner loss asks, by target
OwnerTerms = TargetTokens | tuple[TargetTokens, ...]  # one owner term's tokens, or several terms' (a loss each)


def joint_owner_tokens(tokenizer) -> OwnerTokens:
    """Joint's pilots (`vocab.FIRST_NAMES`), `is`/`has`, the space and the full stops as
    `tokenizer` writes them; each must be one token, and a name the same token after a space as at
    a line's start."""
    from clover.data.tasks.vocab import FIRST_NAMES

    required = single_tokens(tokenizer, (*FIRST_NAMES, "is", "has", " ", "."), "line-owner supervision")
    after_space = {name: tokenizer(f"? {name}", add_special_tokens=False).input_ids[-1] for name in FIRST_NAMES}
    if moved := [name for name in FIRST_NAMES if after_space[name] != required[name]]:
        raise ValueError(f"line-owner supervision needs the names {moved} to be the same token after a space")
    return OwnerTokens(tuple(required[name] for name in FIRST_NAMES), frozenset((required["is"], required["has"])),
                       required[" "], full_stops(tokenizer))


def joint_asked_tokens(tokenizer) -> AskedTokens:
    """Joint's properties (`BASE`, `DERIVED`), `?` and the newline tokens as `tokenizer` writes them;
    each property and `?` must be one token."""
    from clover.data.tasks.joint import BASE, DERIVED

    required = single_tokens(tokenizer, (*BASE, *DERIVED, "?"), "asked-property supervision")
    newlines = frozenset(i for i in range(len(tokenizer)) if "\n" in tokenizer.decode([i]))
    return AskedTokens(tuple(required[word] for word in (*BASE, *DERIVED)), required["?"], newlines)


def joint_rule_first_tokens(tokenizer) -> RuleFirstTokens:
    """Joint's properties (`BASE`, `DERIVED`), `Anyone` and the full stops as `tokenizer` writes them;
    each property and `Anyone` must be one token."""
    from clover.data.tasks.joint import BASE, DERIVED

    required = single_tokens(tokenizer, (*BASE, *DERIVED, "Anyone"), "rule-first supervision")
    return RuleFirstTokens(tuple(required[word] for word in (*BASE, *DERIVED)), required["Anyone"],
                           full_stops(tokenizer))


JOINT_TARGET_TOKENS = {"pilot": joint_owner_tokens, "asked": joint_asked_tokens,
                       "rule_first": joint_rule_first_tokens}  # owner target -> joint's tokens for it
OWNER_TARGETS = tuple(JOINT_TARGET_TOKENS)


def rule_first_owners(ids: list[int], tokens: RuleFirstTokens) -> list[int]:
    """For each token of `ids`, the class of its rule's first condition (the first property after
    the opener) where it is a rule sentence's last word before the full stop and a property, or -1."""
    property_class = {t: c for c, t in enumerate(tokens.properties)}
    owners = [-1] * len(ids)
    for j, stop in opened_sentences(ids, tokens.opener, tokens.stops):
        if ids[stop - 1] not in property_class:
            continue
        first = first_index(ids, property_class, j + 1, stop - 1)
        if first is not None:
            owners[stop - 1] = property_class[ids[first]]
    return owners


def asked_owners(ids: list[int], tokens: AskedTokens) -> list[int]:
    """For each token of `ids`, the class of the property its derivation line asks about (a property
    right before `?`; the tokens after the `?` up to the next newline), or -1."""
    property_class = {t: c for c, t in enumerate(tokens.properties)}
    owners, owner = [-1] * len(ids), -1
    for j, t in enumerate(ids):
        if t in tokens.newlines:
            owner = -1
        elif t == tokens.ask and j > 0:
            owner = property_class.get(ids[j - 1], -1)
        else:
            owners[j] = owner
    return owners


def line_owners(ids: list[int], tokens: OwnerTokens) -> list[int]:
    """For each token of `ids`, the class of the pilot whose fact line owns it (module doc), or -1."""
    name_class = {t: c for c, t in enumerate(tokens.names)}
    owners, owner = [-1] * len(ids), -1
    for j, t in enumerate(ids):
        if owner < 0 and t in name_class and j + 2 < len(ids) and ids[j + 1] == tokens.space \
                and ids[j + 2] in tokens.verbs:
            owner = name_class[t]
            continue
        owners[j] = owner
        if owner >= 0 and t in tokens.stops:
            owner = -1
    return owners


def batch_owners(batch: Batch, tokens: TargetTokens) -> torch.Tensor:
    """[N, P + R] long: `tokens.owners` (`line_owners`, `asked_owners` or `rule_first_owners`) over
    each row's real prompt tokens and targeted response; -1 on padding and untargeted tokens."""
    rows = []
    for prompt, real, response, targeted in zip(batch.prompt_ids.tolist(), batch.prompt_mask.tolist(),
                                                batch.response_ids.tolist(), batch.target_mask.tolist()):
        kept = [c for c, r in enumerate(real) if r] + [len(prompt) + j for j, t in enumerate(targeted) if t]
        seq = prompt + response
        row = [-1] * len(seq)
        for column, owner in zip(kept, tokens.owners([seq[c] for c in kept])):
            row[column] = owner
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long, device=batch.prompt_ids.device)


class RecordedResiduals:
    """Within `with`, the clean rows of decoder layer `layer`'s output in every forward of `model`:
    a list that gets, per call, the rows before its noisy block ([N, T - block_len, D])."""

    def __init__(self, model, layer: int):
        layers = model.model.layers
        if not 0 <= layer < len(layers):
            raise ValueError(f"owner_layer={layer} is not one of the model's {len(layers)} decoder layers")
        self.layer, self.recorded = layers[layer], None
        # where the layer's forward takes `block_len` (the model passes its arguments by position)
        self.block_len_at = list(inspect.signature(self.layer.forward).parameters).index("block_len")

    def _hook(self, module, args, output):
        x, block_len = output[0], args[self.block_len_at]
        self.recorded.append(x[:, :x.shape[1] - block_len])

    def __enter__(self) -> list[torch.Tensor]:
        self.recorded = []
        self.handle = self.layer.register_forward_hook(self._hook)
        return self.recorded

    def __exit__(self, *exc):
        self.handle.remove()
        self.recorded = None


def line_owner_loss(residuals: torch.Tensor, owners: torch.Tensor, name_embeddings: torch.Tensor,
                    readout: str = "embedding") -> torch.Tensor:
    """The loss of each owned token's pilot (`owners` [N, T], -1: none) read from its residual
    ([N, T, D]) by `readout` (module doc; the names' embeddings [C, D] give the classes); 0 when no
    token is owned, or with `"ridge"` when one half of the batch has none."""
    owned = owners >= 0
    if readout not in OWNER_READOUTS:
        raise ValueError(f"owner readout {readout!r} must be one of {OWNER_READOUTS}")
    if not owned.any():
        return residuals.new_zeros((), dtype=torch.float)
    h, y = residuals[owned].float(), owners[owned]  # [M, D], [M]
    if readout == "ridge":
        rows = torch.arange(owners.shape[0], device=owners.device)[:, None].expand_as(owners)[owned]
        return ridge_probe_loss(h, y, rows % 2, name_embeddings.shape[0])
    names = F.normalize(name_embeddings.detach().float(), dim=-1)  # [C, D]
    return F.cross_entropy(SCALE * F.normalize(h, dim=-1) @ names.T, y)


def ridge_probe_loss(h: torch.Tensor, y: torch.Tensor, half: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Mean squared error of one-hot labels `y` [M] predicted on each `half` [M] (0 or 1) of the
    samples `h` [M, D] by a ridge regression fitted on the other half (module doc)."""
    if half.unique().numel() < 2:
        return h.new_zeros(())
    x = (h - h.mean(0).detach()) / (h.std(0).detach() + 1e-6)
    x = torch.cat((x, x.new_ones(len(x), 1)), dim=1)  # [M, D + 1]: with a bias
    target = F.one_hot(y, num_classes).float()
    errors = []
    for side in (0, 1):
        fit, held = half != side, half == side
        a = x[fit].detach()
        w = torch.linalg.solve(a.T @ a + RIDGE * len(a) * torch.eye(a.shape[1], device=a.device),
                               a.T @ target[fit])  # [D + 1, C]
        errors.append((x[held] @ w - target[held]).square().sum(-1))
    return torch.cat(errors).mean()
