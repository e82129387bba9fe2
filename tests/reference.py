"""Brute-force reference: materialise vt = v W_O[h] for every head in float64 and apply the definitions.

Padded examples are run one at a time on their real tokens only (with their original position ids), so
the reference never sees a padded position: that also checks that padding changes nothing else.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from tiny_models import TinyFamily


def _unpadded_metrics(family: TinyFamily, model: nn.Module, main: Tensor, **kwargs) -> dict[str, Tensor]:
    attentions = [m for m in model.modules() if type(m).__name__ == family.attention_class]
    values, projected_outputs, hooks = [], [], []
    for attention in attentions:
        value_module = attention.get_submodule(family.value_path)
        hooks.append(value_module.register_forward_hook(
            lambda mod, args, out, a=attention: values.append(family.value_of(a, out))))
        projection = family.projection(model, attention)
        hooks.append(projection.register_forward_hook(lambda mod, args, out: projected_outputs.append(out)))
    with torch.no_grad():
        output = model(main, output_attentions=True, **kwargs)
    for hook in hooks:
        hook.remove()

    layers = []
    for layer, attention in enumerate(attentions):
        alpha = output.attentions[layer]  # [batch, head, n, n]
        batch, heads, n, _ = alpha.shape
        projection = family.projection(model, attention)
        weight, bias = family.projection_weight(projection), projection.bias  # [heads*d, d_model], [d_model]
        w_o = weight.reshape(heads, -1, weight.shape[1])  # [head, d, d_model]
        v = values[layer].reshape(batch, n, -1, w_o.shape[1]).transpose(1, 2)  # [batch, kv_head, n, d]
        v = v.repeat_interleave(heads // v.shape[1], dim=1)  # [batch, head, n, d]
        vt = torch.einsum("bhnd,hdm->bhnm", v, w_o)  # [batch, head, n, d_model]
        o_head = torch.einsum("bhij,bhjm->bhim", alpha, vt)  # [batch, head, n, d_model]
        o = o_head.sum(1)  # [batch, n, d_model]
        # the reference is only trusted if it rebuilds the module's projected output
        rebuilt = o + (bias if bias is not None else 0)
        torch.testing.assert_close(rebuilt, projected_outputs[layer], rtol=1e-9, atol=1e-9)

        vt_norm = vt.norm(dim=-1)[:, :, None, :]  # [batch, head, 1, key]
        o_head_norm = o_head.norm(dim=-1)[..., None]  # [batch, head, query, 1]
        o_norm = o.norm(dim=-1)[:, None, :, None]  # [batch, 1, query, 1]
        inter_dot = torch.einsum("bim,bhjm->bhij", o, vt)
        intra_dot = torch.einsum("bhim,bhjm->bhij", o_head, vt)
        layers.append({
            "attention": alpha,
            "value_weighted": alpha * vt_norm,
            "output_normalized": alpha * vt_norm / o_head_norm,
            "cw_intra": alpha * intra_dot / o_head_norm**2,
            "cw_inter": alpha * inter_dot / o_norm**2,
            "relative_norm_inter": (vt_norm / o_norm).expand_as(alpha),
            "cosine_inter": inter_dot / (o_norm * vt_norm),
        })
    return {name: torch.stack([layer[name] for layer in layers], 1) for name in layers[0]}


def reference_metrics(family: TinyFamily, model: nn.Module, inputs: Tensor, mask: Tensor | None) -> dict[str, Tensor]:
    """Every metric per head, ``(batch, layer, head, n, n)`` in float64; padded rows and keys are 0."""
    model = copy.deepcopy(model).double()
    model.set_attn_implementation("eager")
    if mask is None:
        return _unpadded_metrics(family, model, inputs.double() if inputs.is_floating_point() else inputs)
    examples = []
    for ids, real in zip(inputs, mask.bool()):
        positions = real.nonzero().flatten()
        position_ids = family.position_ids(positions)  # None: the model numbers its real tokens itself
        kwargs = {} if position_ids is None else {"position_ids": position_ids}
        metrics = _unpadded_metrics(family, model, ids[real][None], **kwargs)
        full = {}
        for name, value in metrics.items():  # [1, layer, head, m, m] -> [1, layer, head, n, n]
            embedded = value.new_zeros(*value.shape[:3], len(ids), len(ids))
            embedded[..., positions[:, None], positions[None, :]] = value
            full[name] = embedded
        examples.append(full)
    return {name: torch.cat([example[name] for example in examples]) for name in examples[0]}
