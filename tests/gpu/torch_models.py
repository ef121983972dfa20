"""Real training and inference steps for bench/share.py and the sharing GPU tests, defined here so that
nothing is downloaded (no pretrained weights, no torchvision): each factory builds its model on the
GPU and returns one step as a callable.

* transformer: a decoder-only transformer's training step (12 layers, d_model 1024, 16 heads, sequence
  512, batch 16, a 32k vocabulary), bf16 autocast, AdamW: kernels from microseconds (element-wise,
  the optimizer's) to milliseconds (GEMMs, attention), with the host's Python and autograd between.
* resnet-train: ResNet-50 (the torchvision layout: bottlenecks 3-4-6-3), batch 64 of 224x224 images,
  channels_last, bf16 autocast, SGD with momentum.
* resnet-train-32, resnet-train-16: the same at batch 32 and 16: on the H100 host as many steps a second as
  at 64 (its Python and launches bound them), a pair with room on the GPU (docs/performance.md).
* resnet-infer: the same network's forward pass, batch 256, bf16, no gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.down = (
            nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
            if stride != 1 or inplanes != out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.down(x))


def resnet50(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    inplanes = 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
            inplanes = planes * Bottleneck.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, classes)]
    return nn.Sequential(*layers)


def training_step(loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> Callable[[], None]:
    """One step: the loss's forward pass under bf16 autocast, backward, the optimizer's step."""

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            value = loss()
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def transformer() -> Callable[[], None]:
    vocab, d_model, layers, heads, seq, batch = 32000, 1024, 12, 16, 512, 16
    dev = "cuda"
    block = nn.TransformerEncoderLayer(
        d_model, heads, 4 * d_model, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    model = nn.ModuleDict(
        {
            "embed": nn.Embedding(vocab, d_model),
            "blocks": nn.TransformerEncoder(block, layers, enable_nested_tensor=False),
            "norm": nn.LayerNorm(d_model),
            "head": nn.Linear(d_model, vocab),
        }
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=dev)
    mask = nn.Transformer.generate_square_subsequent_mask(seq, device=dev)

    def loss() -> torch.Tensor:
        h = model["blocks"](model["embed"](tokens[:, :-1]), mask=mask, is_causal=True)
        logits = model["head"](model["norm"](h))
        return nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))

    return training_step(loss, opt)


def resnet_train(batch: int = 64) -> Callable[[], None]:
    torch.backends.cudnn.benchmark = True
    model = resnet50().to("cuda", memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")

    return training_step(lambda: nn.functional.cross_entropy(model(x), y), opt)


def resnet_infer() -> Callable[[], None]:
    torch.backends.cudnn.benchmark = True
    model = resnet50().to("cuda", dtype=torch.bfloat16, memory_format=torch.channels_last).eval()
    x = torch.randn(256, 3, 224, 224, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)

    def step() -> None:
        with torch.inference_mode():
            model(x)

    return step


WORKLOADS: dict[str, Callable[[], Callable[[], None]]] = {
    "transformer": transformer,
    "resnet-train": resnet_train,
    "resnet-train-32": lambda: resnet_train(32),
    "resnet-train-16": lambda: resnet_train(16),
    "resnet-infer": resnet_infer,
}
