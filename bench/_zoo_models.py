"""Model registry of the zoo run (bench/zoo.py): torchvision, transformers and timm models
built from configs with random weights (nothing is downloaded).

What: one ZooSpec per model: a builder (seeded, dropout and drop-path off), the example
inputs at the zoo's small sizes, and the loss. Why a separate file: the driver lists and
filters the names without importing timm/transformers; only the per-model worker process
builds anything. Sizes: batch 2, images 64x64 where the model allows (ViT-like models get
img_size=64 or 56 through their constructors), the native size where it does not
(inception_v3 299: its train-mode aux head needs a 17x17 map; maxvit 224: 7x7 partitions);
transformers at hidden 128, 2 layers, 4 heads, 2 x 32 tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

BATCH = 2
IMG = 64
SEQ = 32
VOCAB = 1000


@dataclass
class ZooSpec:
    name: str  # row name: "<source>/<model>"
    source: str  # torchvision | torchvision-seg | transformers | timm
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], Tuple[torch.Tensor, ...]]
    shape: str
    notes: List[str] = field(default_factory=list)


def zero_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """p = 0 on every Dropout / StochasticDepth / timm DropPath module (in place): every variant
    must compute the same function, with no RNG to match between eager and TorchScript."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        kind = type(m).__name__
        if kind == "StochasticDepth":
            m.p = 0.0
        if kind in ("DropPath", "DropBlock2d") and hasattr(m, "drop_prob"):
            m.drop_prob = 0.0
    return model


def _image(hw: int, c: int = 3):
    def make():
        g = torch.Generator().manual_seed(1234)
        return (torch.randn(BATCH, c, hw, hw, generator=g),)

    return make


def _tokens():
    g = torch.Generator().manual_seed(1234)
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),)


class OutWrap(torch.nn.Module):
    """Segmentation models return a Dict[str, Tensor]: the user's training loop reads ["out"]."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


# ---- torchvision ------------------------------------------------------------------------

# Input side per model where 64 does not work; constructor kwargs where the size is a parameter.
TV_SIZE = {"inception_v3": 299, "maxvit_t": 224}
TV_KWARGS = {
    "vit_b_16": dict(image_size=64),
    "vit_b_32": dict(image_size=64),
    "vit_l_16": dict(image_size=64),
    "vit_l_32": dict(image_size=64),
    "vit_h_14": dict(image_size=56),
}
TV_CLASSIFICATION = [
    "alexnet",
    "convnext_base",
    "convnext_large",
    "convnext_small",
    "convnext_tiny",
    "densenet121",
    "densenet161",
    "densenet169",
    "densenet201",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_v2_l",
    "efficientnet_v2_m",
    "efficientnet_v2_s",
    "googlenet",
    "inception_v3",
    "maxvit_t",
    "mnasnet0_5",
    "mnasnet0_75",
    "mnasnet1_0",
    "mnasnet1_3",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "regnet_x_16gf",
    "regnet_x_1_6gf",
    "regnet_x_32gf",
    "regnet_x_3_2gf",
    "regnet_x_400mf",
    "regnet_x_800mf",
    "regnet_x_8gf",
    "regnet_y_128gf",
    "regnet_y_16gf",
    "regnet_y_1_6gf",
    "regnet_y_32gf",
    "regnet_y_3_2gf",
    "regnet_y_400mf",
    "regnet_y_800mf",
    "regnet_y_8gf",
    "resnet101",
    "resnet152",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5",
    "shufflenet_v2_x2_0",
    "squeezenet1_0",
    "squeezenet1_1",
    "swin_b",
    "swin_s",
    "swin_t",
    "swin_v2_b",
    "swin_v2_s",
    "swin_v2_t",
    "vgg11",
    "vgg11_bn",
    "vgg13",
    "vgg13_bn",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "vit_b_16",
    "vit_b_32",
    "vit_h_14",
    "vit_l_16",
    "vit_l_32",
    "wide_resnet101_2",
    "wide_resnet50_2",
]
TV_SEGMENTATION = [
    "deeplabv3_mobilenet_v3_large",
    "deeplabv3_resnet101",
    "deeplabv3_resnet50",
    "fcn_resnet101",
    "fcn_resnet50",
    "lraspp_mobilenet_v3_large",
]


def _tv(arch: str, seg: bool):
    def build():
        import torchvision

        torch.manual_seed(0)
        kw = dict(TV_KWARGS.get(arch, {}))
        if seg:
            model = OutWrap(torchvision.models.get_model(arch, weights=None, weights_backbone=None))
        else:
            model = torchvision.models.get_model(arch, weights=None, **kw)
        return zero_dropout(model)

    return build


# ---- transformers -----------------------------------------------------------------------


class HFWrap(torch.nn.Module):
    """transformers model -> last_hidden_state (a plain tensor, as bench/_suite_models.HFWrap);
    encoder-decoders get the ids as decoder ids too; vision models take pixel_values."""

    def __init__(self, model, kind: str):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, x):
        if self.kind == "encdec":
            out = self.model(input_ids=x, decoder_input_ids=x)
        elif self.kind == "pixels":
            out = self.model(pixel_values=x)
        else:
            out = self.model(input_ids=x)
        return out.last_hidden_state


_SMALL = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=512,
    vocab_size=VOCAB,
    max_position_embeddings=128,
)
_DEC = dict(_SMALL, num_key_value_heads=4, use_cache=False)
# family -> (model class, config class, config kwargs, input kind)
HF_FAMILIES: Dict[str, Tuple[str, str, dict, str]] = {
    "bert": ("BertModel", "BertConfig", _SMALL, "ids"),
    "roberta": ("RobertaModel", "RobertaConfig", dict(_SMALL, pad_token_id=1), "ids"),
    "distilbert": (
        "DistilBertModel",
        "DistilBertConfig",
        dict(
            dim=128,
            n_layers=2,
            n_heads=4,
            hidden_dim=512,
            vocab_size=VOCAB,
            max_position_embeddings=128,
        ),
        "ids",
    ),
    "albert": ("AlbertModel", "AlbertConfig", dict(_SMALL, embedding_size=64), "ids"),
    "electra": ("ElectraModel", "ElectraConfig", dict(_SMALL, embedding_size=64), "ids"),
    "deberta_v2": ("DebertaV2Model", "DebertaV2Config", _SMALL, "ids"),
    "gpt2": (
        "GPT2Model",
        "GPT2Config",
        dict(n_embd=128, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=128, use_cache=False),
        "ids",
    ),
    "gpt_neo": (
        "GPTNeoModel",
        "GPTNeoConfig",
        dict(
            hidden_size=128,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            vocab_size=VOCAB,
            max_position_embeddings=128,
            use_cache=False,
        ),
        "ids",
    ),
    "opt": (
        "OPTModel",
        "OPTConfig",
        dict(
            hidden_size=128,
            num_hidden_layers=2,
            ffn_dim=512,
            num_attention_heads=4,
            word_embed_proj_dim=128,
            vocab_size=VOCAB,
            max_position_embeddings=128,
            use_cache=False,
        ),
        "ids",
    ),
    "bloom": (
        "BloomModel",
        "BloomConfig",
        dict(hidden_size=128, n_layer=2, n_head=4, vocab_size=VOCAB, use_cache=False),
        "ids",
    ),
    "llama": ("LlamaModel", "LlamaConfig", _DEC, "ids"),
    "mistral": ("MistralModel", "MistralConfig", _DEC, "ids"),
    "qwen2": ("Qwen2Model", "Qwen2Config", _DEC, "ids"),
    "phi": ("PhiModel", "PhiConfig", _DEC, "ids"),
    "gemma": ("GemmaModel", "GemmaConfig", dict(_DEC, head_dim=32), "ids"),
    "falcon": (
        "FalconModel",
        "FalconConfig",
        dict(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=VOCAB,
            use_cache=False,
        ),
        "ids",
    ),
    "t5": (
        "T5Model",
        "T5Config",
        dict(
            d_model=128,
            d_ff=512,
            d_kv=32,
            num_layers=2,
            num_heads=4,
            vocab_size=VOCAB,
            use_cache=False,
        ),
        "encdec",
    ),
    "bart": (
        "BartModel",
        "BartConfig",
        dict(
            d_model=128,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=512,
            decoder_ffn_dim=512,
            vocab_size=VOCAB,
            max_position_embeddings=128,
            use_cache=False,
        ),
        "encdec",
    ),
    "vit": (
        "ViTModel",
        "ViTConfig",
        dict(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=512,
            image_size=IMG,
            patch_size=8,
        ),
        "pixels",
    ),
    "swin": (
        "SwinModel",
        "SwinConfig",
        dict(
            image_size=IMG,
            patch_size=4,
            embed_dim=32,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=4,
        ),
        "pixels",
    ),
    "convnext": (
        "ConvNextModel",
        "ConvNextConfig",
        dict(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1]),
        "pixels",
    ),
}


def _zero_config_dropout(cfg) -> None:
    for k, v in list(vars(cfg).items()):
        if isinstance(v, float) and (
            "dropout" in k or k.endswith("pdrop") or k == "drop_path_rate"
        ):
            setattr(cfg, k, 0.0)


def _hf(family: str):
    def build():
        import transformers

        transformers.logging.set_verbosity_error()
        model_cls, cfg_cls, kw, kind = HF_FAMILIES[family]
        torch.manual_seed(0)
        cfg = getattr(transformers, cfg_cls)(**kw)
        _zero_config_dropout(cfg)
        model = getattr(transformers, model_cls)(cfg)
        return HFWrap(zero_dropout(model), kind)

    return build


# ---- timm -------------------------------------------------------------------------------

# model -> (input side, create_model kwargs). Side 64 unless the architecture needs more.
TIMM: Dict[str, Tuple[int, dict]] = {
    # named by issue 9
    "resmlp_12_224": (64, dict(img_size=64)),
    "vit_tiny_patch16_224": (64, dict(img_size=64)),
    "deit_tiny_patch16_224": (64, dict(img_size=64)),
    "deit_tiny_distilled_patch16_224": (64, dict(img_size=64)),
    "eva02_tiny_patch14_224": (56, dict(img_size=56)),
    "dm_nfnet_f0": (64, {}),
    "regnety_002": (64, {}),
    "resnest14d": (64, {}),
    "seresnext26d_32x4d": (64, {}),
    "tresnet_m": (64, {}),
    "resnetv2_50x1_bit": (64, {}),
    # CNNs
    "resnet26d": (64, {}),
    "resnet50d": (64, {}),
    "resnet10t": (64, {}),
    "ecaresnet26t": (64, {}),
    "skresnet18": (64, {}),
    "res2net50_26w_4s": (64, {}),
    "resnet50_gn": (64, {}),
    "dla34": (64, {}),
    "dpn68": (64, {}),
    "densenet121": (64, {}),
    "xception41": (64, {}),
    "cspresnet50": (64, {}),
    "cspdarknet53": (64, {}),
    "hrnet_w18_small": (64, {}),
    "efficientnet_b0": (64, {}),
    "mobilenetv3_large_100": (64, {}),
    "mobilenetv2_100": (64, {}),
    "mnasnet_100": (64, {}),
    "ghostnet_100": (64, {}),
    "rexnet_100": (64, {}),
    "lcnet_050": (64, {}),
    "tinynet_a": (64, {}),
    "repvgg_a0": (64, {}),
    "mobileone_s0": (64, {}),
    "hardcorenas_a": (64, {}),
    "selecsls42b": (64, {}),
    "ese_vovnet19b_dw": (64, {}),
    "gernet_s": (64, {}),
    "nf_resnet26": (64, {}),
    "regnetx_002": (64, {}),
    "convnext_atto": (64, {}),
    "convnextv2_atto": (64, {}),
    "inception_next_atto": (64, {}),
    "hgnetv2_b0": (64, {}),
    "ghostnetv2_100": (64, {}),
    "inception_v3": (299, {}),
    "fastvit_t8": (64, {}),
    "efficientvit_b0": (64, {}),
    "mobilevit_xxs": (64, {}),
    "edgenext_xx_small": (64, {}),
    "poolformer_s12": (64, {}),
    "botnet26t_256": (64, dict(img_size=64)),
    "halonet26t": (256, {}),
    "lambda_resnet26t": (64, dict(img_size=64)),
    # transformers / MLPs
    "vit_small_patch16_224": (64, dict(img_size=64)),
    "deit3_small_patch16_224": (64, dict(img_size=64)),
    "vit_relpos_small_patch16_224": (64, dict(img_size=64)),
    "beit_base_patch16_224": (64, dict(img_size=64)),
    "cait_xxs24_224": (64, dict(img_size=64)),
    "xcit_nano_12_p16_224": (64, dict(img_size=64)),
    "pit_ti_224": (64, dict(img_size=64)),
    "convit_tiny": (64, dict(img_size=64)),
    "tnt_s_patch16_224": (64, dict(img_size=64)),
    "mixer_b16_224": (64, dict(img_size=64)),
    "gmlp_ti16_224": (64, dict(img_size=64)),
    "swin_tiny_patch4_window7_224": (224, {}),
    "levit_128s": (64, dict(img_size=64)),
    "coat_lite_tiny": (64, dict(img_size=64)),
    "twins_svt_small": (64, dict(img_size=64)),
    "visformer_tiny": (64, dict(img_size=64)),
    "sequencer2d_s": (64, dict(img_size=64)),
    "coatnet_nano_rw_224": (64, dict(img_size=64)),
    "maxvit_nano_rw_256": (64, dict(img_size=64)),
    "tiny_vit_5m_224": (224, {}),
}


def _timm(arch: str, kwargs: dict):
    def build():
        import timm

        torch.manual_seed(0)
        try:
            model = timm.create_model(
                arch, pretrained=False, drop_rate=0.0, drop_path_rate=0.0, **kwargs
            )
        except TypeError:  # architectures without stochastic depth take no drop_path_rate
            torch.manual_seed(0)
            model = timm.create_model(arch, pretrained=False, drop_rate=0.0, **kwargs)
        return zero_dropout(model)

    return build


def registry() -> Dict[str, ZooSpec]:
    specs: List[ZooSpec] = []
    for a in TV_CLASSIFICATION:
        hw = TV_SIZE.get(a, IMG)
        specs.append(
            ZooSpec(
                f"torchvision/{a}", "torchvision", _tv(a, False), _image(hw), f"{BATCH}x3x{hw}x{hw}"
            )
        )
    for a in TV_SEGMENTATION:
        specs.append(
            ZooSpec(
                f"torchvision/{a}",
                "torchvision-seg",
                _tv(a, True),
                _image(IMG),
                f"{BATCH}x3x{IMG}x{IMG}",
            )
        )
    for f, (_, _, _, kind) in HF_FAMILIES.items():
        if kind == "pixels":
            specs.append(
                ZooSpec(
                    f"transformers/{f}",
                    "transformers",
                    _hf(f),
                    _image(IMG),
                    f"{BATCH}x3x{IMG}x{IMG}",
                )
            )
        else:
            specs.append(
                ZooSpec(
                    f"transformers/{f}", "transformers", _hf(f), _tokens, f"{BATCH}x{SEQ} tokens"
                )
            )
    for a, (hw, kw) in TIMM.items():
        specs.append(ZooSpec(f"timm/{a}", "timm", _timm(a, kw), _image(hw), f"{BATCH}x3x{hw}x{hw}"))
    return {s.name: s for s in specs}


# Models above ~80M parameters (or very slow at these sizes): run last, one at a time
# (`zoo.py --models heavy --jobs 1`), so that two of them never share the machine's memory.
HEAVY = [
    "torchvision/" + a
    for a in (
        "regnet_y_128gf",
        "vit_h_14",
        "vit_l_16",
        "vit_l_32",
        "regnet_y_32gf",
        "regnet_x_32gf",
        "efficientnet_v2_l",
        "convnext_large",
        "swin_v2_b",
        "swin_b",
        "convnext_base",
        "vgg11",
        "vgg11_bn",
        "vgg13",
        "vgg13_bn",
        "vgg16",
        "vgg16_bn",
        "vgg19",
        "vgg19_bn",
        "resnext101_64x4d",
        "resnext101_32x8d",
        "wide_resnet101_2",
        "regnet_y_16gf",
        "regnet_x_16gf",
        "vit_b_16",
        "vit_b_32",
        "efficientnet_v2_m",
        "efficientnet_b7",
        "maxvit_t",
        "fcn_resnet101",
        "deeplabv3_resnet101",
    )
] + ["timm/beit_base_patch16_224", "timm/mixer_b16_224"]

# Small, fast models of every source: `zoo.py --quick`.
QUICK = [
    "torchvision/resnet18",
    "torchvision/mobilenet_v3_small",
    "torchvision/googlenet",
    "torchvision/lraspp_mobilenet_v3_large",
    "transformers/bert",
    "transformers/gpt2",
    "timm/resmlp_12_224",
    "timm/regnety_002",
    "timm/vit_tiny_patch16_224",
]
