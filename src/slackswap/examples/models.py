"""Small GPT-2-like, BERT-like and Llama-like models in plain torch (no downloads).

Each model's ``forward(tokens, targets)`` returns the scalar training loss, so the loss is
computed inside the model's own call (a plan may then recompute through it). Sizes come
from an ExampleConfig; ``make_example(kind, config)`` builds one with a fixed seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ExampleConfig:
    vocab: int = 64
    seq_len: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    ffn: int = 64
    dropout: float = 0.1
    micro_batch: int = 2


TINY = ExampleConfig()


# ---- GPT-2-like: learned positions, pre-norm, eager causal attention, GELU MLP ------------------
class GPTAttention(nn.Module):
    def __init__(self, c: ExampleConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden)
        self.proj = nn.Linear(c.hidden, c.hidden)
        self.attn_drop = nn.Dropout(c.dropout)
        self.resid_drop = nn.Dropout(c.dropout)
        mask = torch.tril(torch.ones(c.seq_len, c.seq_len, dtype=torch.bool))
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(h // self.heads)
        scores = scores.masked_fill(~self.causal[:s, :s], float("-inf"))
        probs = self.attn_drop(scores.softmax(dim=-1))
        out = (probs @ v).transpose(1, 2).reshape(b, s, h)
        return self.resid_drop(self.proj(out))


class GPTMLP(nn.Module):
    def __init__(self, c: ExampleConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(c.hidden, c.ffn)
        self.act = nn.GELU()
        self.proj = nn.Linear(c.ffn, c.hidden)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class GPTBlock(nn.Module):
    def __init__(self, c: ExampleConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.hidden)
        self.attn = GPTAttention(c)
        self.ln2 = nn.LayerNorm(c.hidden)
        self.mlp = GPTMLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT2Like(nn.Module):
    def __init__(self, c: ExampleConfig = TINY) -> None:
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab, c.hidden)
        self.wpe = nn.Embedding(c.seq_len, c.hidden)
        self.drop = nn.Dropout(c.dropout)
        self.h = nn.ModuleList(GPTBlock(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.hidden)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


# ---- BERT-like: post-norm, bidirectional attention, masked-LM head -----------------------------
class BertLayer(nn.Module):
    def __init__(self, c: ExampleConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden)
        self.out = nn.Linear(c.hidden, c.hidden)
        self.ln1 = nn.LayerNorm(c.hidden)
        self.fc1 = nn.Linear(c.hidden, c.ffn)
        self.fc2 = nn.Linear(c.ffn, c.hidden)
        self.ln2 = nn.LayerNorm(c.hidden)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        probs = self.drop(((q @ k.transpose(-2, -1)) * (h // self.heads) ** -0.5).softmax(-1))
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.drop(self.out(ctx)))
        # The dropout module is called a second time in the same forward (its own module call).
        return self.ln2(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))


class BertLike(nn.Module):
    def __init__(self, c: ExampleConfig = TINY) -> None:
        super().__init__()
        self.config = c
        self.tok = nn.Embedding(c.vocab, c.hidden)
        self.pos = nn.Embedding(c.seq_len, c.hidden)
        self.ln = nn.LayerNorm(c.hidden)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.layers))
        self.mlm_dense = nn.Linear(c.hidden, c.hidden)
        self.mlm_ln = nn.LayerNorm(c.hidden)
        self.decoder = nn.Linear(c.hidden, c.vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.ln(self.tok(tokens) + self.pos(pos)))
        for layer in self.layers:
            x = layer(x)
        logits = self.decoder(self.mlm_ln(F.gelu(self.mlm_dense(x))))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-100)


# ---- Llama-like: RMSNorm, rotary positions, SDPA causal attention, SwiGLU, no dropout -----------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaAttention(nn.Module):
    def __init__(self, c: ExampleConfig) -> None:
        super().__init__()
        self.heads = c.heads
        d = c.hidden // c.heads
        self.wq = nn.Linear(c.hidden, c.hidden, bias=False)
        self.wk = nn.Linear(c.hidden, c.hidden, bias=False)
        self.wv = nn.Linear(c.hidden, c.hidden, bias=False)
        self.wo = nn.Linear(c.hidden, c.hidden, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        angles = torch.outer(torch.arange(c.seq_len).float(), inv)
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        shape = (b, s, self.heads, h // self.heads)
        q, k, v = (w(x).view(shape).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = _rotate(q, self.cos[:s], self.sin[:s]), _rotate(k, self.cos[:s], self.sin[:s])
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, h))


class LlamaMLP(nn.Module):
    def __init__(self, c: ExampleConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(c.hidden, c.ffn, bias=False)
        self.up = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, c: ExampleConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(c.hidden)
        self.attn = LlamaAttention(c)
        self.mlp_norm = RMSNorm(c.hidden)
        self.mlp = LlamaMLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class LlamaLike(nn.Module):
    def __init__(self, c: ExampleConfig = TINY) -> None:
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(LlamaBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


EXAMPLES = {"gpt2": GPT2Like, "bert": BertLike, "llama": LlamaLike}


def make_example(kind: str, config: ExampleConfig = TINY, *, seed: int = 0, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> nn.Module:
    from ..errors import UnknownNameError

    if kind not in EXAMPLES:
        raise UnknownNameError(f"unknown example model {kind!r}: choose one of {', '.join(EXAMPLES)}")
    torch.manual_seed(seed)
    return EXAMPLES[kind](config).to(device=device, dtype=dtype)


def make_batch(config: ExampleConfig = TINY, *, seed: int = 1, device: str | torch.device = "cpu"):
    """(tokens, targets) of shape (micro_batch, seq_len); targets are the next tokens."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, config.vocab, (config.micro_batch, config.seq_len + 1), generator=g)
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    tokens, targets = batch
    return model(tokens, targets)
