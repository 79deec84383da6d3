import torch
import torch.nn as nn


class Model(nn.Module):
    """A small image classifier, fp32: four conv-BN-ReLU stages (two max-pooled), global average pooling, a classifier."""

    def __init__(self, num_classes: int):
        super().__init__()

        def stage(cin: int, cout: int, stride: int, pool: bool) -> list[nn.Module]:
            layers: list[nn.Module] = [
                nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False, dtype=DTYPE),
                nn.BatchNorm2d(cout, dtype=DTYPE),
                nn.ReLU(inplace=True),
            ]
            if pool:
                layers.append(nn.MaxPool2d(2))
            return layers

        self.features = nn.Sequential(
            *stage(3, 32, 2, False),
            *stage(32, 64, 1, True),
            *stage(64, 128, 1, True),
            *stage(128, 256, 1, False),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(256, num_classes, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


batch = 64
image_size = 224
num_classes = 1000
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, 3, image_size, image_size, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [num_classes]
