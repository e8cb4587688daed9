"""The k-nearest-neighbour head: a classifier over a bank of L2-normalised training features, DINOv2's protocol
(facebookresearch/dinov2 `dinov2/eval/knn.py`): the `k` most cosine-similar bank images vote for their labels
with weights softmax(similarity / T) over the k, T = 0.07. The bank is a pair of buffers, so a saved folder's
`model.safetensors` and an ONNX export carry it; a saved folder copies this file with the model file.

    votes = knn_votes(queries, bank, bank_labels, k=20, temperature=0.07)   # (batch, num_labels), rows sum to 1

The zero-shot head (`head_type: zeroshot`, `ZeroShotHead`) lives here too, as the other head that is more than a
linear layer: an image-text model's classifier (CLIP paper), whose L2 normalisation of the image embedding no
linear layer can hold; its weights come from the text tower (`model.zeroshot`), and it fine-tunes as any head.
"""

from __future__ import annotations

import torch
from torch import nn

KNN_K = 20  # DINOv2's k (its evaluation also reports 10, 100, 200; 20 is its headline)
KNN_TEMPERATURE = 0.07  # DINOv2's T
VOTE_FLOOR = 1e-6  # the smallest vote share a logit stands for: log(0) would be -inf


def knn_votes(
    queries: torch.Tensor, bank: torch.Tensor, bank_labels: torch.Tensor, k: int = KNN_K,
    temperature: float = KNN_TEMPERATURE,
) -> torch.Tensor:  # fmt: skip
    """`(batch, hidden)` queries (normalised here), a `(n, hidden)` unit-norm bank and its `(n, num_labels)`
    one-hot or multi-hot labels -> `(batch, num_labels)` weighted votes: each of the `k` nearest bank images
    (cosine) adds softmax(similarity / temperature) over the k to its labels (single-label rows sum to 1; a
    multi-label vote is the weighted share of neighbours that carry the label)."""
    queries = nn.functional.normalize(queries.to(bank.dtype), dim=-1)
    similarities = queries @ bank.T  # (B, n)
    top, indices = similarities.topk(min(k, bank.shape[0]), dim=-1)  # (B, k), highest first
    weights = (top / temperature).softmax(dim=-1)  # (B, k): exp(sim / T), normalised over the k
    return (weights.unsqueeze(-1) * bank_labels[indices]).sum(dim=1)  # (B, k, labels) -> (B, labels)


class KNNHead(nn.Module):
    """`(batch, hidden)` pooled features -> `(batch, num_labels)` logits of the kNN vote: log(share) for one label
    per image (softmax gives the shares back), log-odds of the share for several (sigmoid gives it back)."""

    def __init__(
        self, hidden: int, num_labels: int, bank_size: int, k: int = KNN_K, temperature: float = KNN_TEMPERATURE,
        multi_label: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        self.k, self.temperature, self.multi_label = k, temperature, multi_label
        self.register_buffer("bank", torch.zeros(bank_size, hidden))  # unit-norm training features
        self.register_buffer("bank_labels", torch.zeros(bank_size, num_labels))  # one-hot / multi-hot rows

    def fill(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Set the bank: `(n, hidden)` features (normalised here) and `(n,)` class ids or `(n, num_labels)` rows."""
        if labels.ndim == 1:
            labels = nn.functional.one_hot(labels.long(), self.bank_labels.shape[1])
        if features.shape[0] != self.bank.shape[0] or labels.shape != (features.shape[0], self.bank_labels.shape[1]):
            raise ValueError(f"a bank of {tuple(self.bank.shape)} cannot hold {tuple(features.shape)} features.")
        self.bank.copy_(nn.functional.normalize(features.float(), dim=-1))
        self.bank_labels.copy_(labels.float())

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        votes = knn_votes(pooled, self.bank, self.bank_labels, self.k, self.temperature)
        if self.multi_label:
            votes = votes.clamp(VOTE_FLOOR, 1 - VOTE_FLOOR)
            return torch.log(votes) - torch.log1p(-votes)  # logit: sigmoid(logit) is the share
        return torch.log(votes.clamp_min(VOTE_FLOOR))


class ZeroShotHead(nn.Module):
    """`(batch, hidden)` pooled features -> `(batch, num_labels)` logits of an image-text model's classifier, as
    transformers' `CLIPModel` / `SiglipModel` compute `logits_per_image`: the image embedding (`projection`: CLIP's
    and MetaCLIP 2's visual projection; SigLIP's pooled feature is its embedding) L2-normalised, then `logits`, a
    linear layer whose rows are the classes' text embeddings times the logit scale and whose bias is SigLIP's logit
    bias (zero for CLIP). The temperature fold and fine-tuning act on `logits` as on a linear head."""

    def __init__(self, hidden: int, num_labels: int, projection_dim: int | None = None) -> None:
        super().__init__()
        self.projection = nn.Identity() if projection_dim is None else nn.Linear(hidden, projection_dim, bias=False)
        self.logits = nn.Linear(projection_dim or hidden, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        embeds = nn.functional.normalize(self.projection(pooled), dim=-1)  # (B, projection_dim), unit norm
        return self.logits(embeds)


def make_head(config, features: int) -> nn.Module:
    """The classifier of `config`: a linear layer, the kNN head for `head_type: knn` (its bank size from
    `knn_bank_size`), the zero-shot head for `head_type: zeroshot`, or nothing (Identity) without labels."""
    labels = config.num_labels
    if labels <= 0:
        return nn.Identity()
    if getattr(config, "head_type", "linear") == "zeroshot":
        return ZeroShotHead(features, labels, getattr(config, "projection_dim", None))
    if getattr(config, "head_type", "linear") == "knn":
        multi = config.problem_type == "multi_label_classification"
        return KNNHead(features, labels, config.knn_bank_size, config.knn_k, config.knn_temperature, multi)
    return nn.Linear(features, labels)


__all__ = ["KNN_K", "KNN_TEMPERATURE", "KNNHead", "ZeroShotHead", "knn_votes", "make_head"]
