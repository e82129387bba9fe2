"""Attention-sink analysis: detection, the three factors of sinks vs other tokens, anti-alignment,
convexity of the output norm in the sink rate, and the sink-norm intervention.

Definitions (per layer ``l``, head ``h``, query row ``i``, sink ``s``; ``vt_j = v_j W_O[h]``):

- received mass of key ``j``: ``mean_{h, i} alpha[h, i, j]`` over the real query rows; ``j`` is a sink
  when it passes ``threshold`` (0.3 by default, after Gu et al., 2024) or, with ``method="first"``, when
  it is the first real token;
- anti-alignment: ``cos(vt_s, sum_{j not sink} alpha_ij vt_j)`` and ``cos(vt_s, o_h,i)``;
- convexity: with the sink given weight ``t`` and the other weights rescaled to ``1 - t`` keeping their
  proportions, ``o(t) = t vt_s + (1 - t) u`` where ``u = sum_{j != s} alpha_ij vt_j / (1 - alpha_is)``;
  ``||o(t)||^2 = t^2 ||vt_s - u||^2 + 2 t <vt_s - u, u> + ||u||^2`` is convex with minimiser
  ``t* = <u - vt_s, u> / ||vt_s - u||^2`` (clipped to [0, 1]).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from captum_cw.architectures import find_attention_layers
from captum_cw.capture import AttentionCall, capture_attention
from captum_cw.errors import InputError
from captum_cw.geometry import HeadGeometry, safe_divide
from captum_cw.interventions import mask_values
from captum_cw.scan import ModelInputs, scan_geometry
from captum_cw.selection import select_indices

__all__ = ["SinkAnalysis", "SinkNormEffect", "analyze_sinks", "matched_control", "optimal_sink_rate",
           "scale_sink_values", "sink_norm_effect"]


def optimal_sink_rate(sink: Tensor, rest: Tensor) -> tuple[Tensor, Tensor]:
    r"""
    Minimiser of ``||t sink + (1 - t) rest||`` over ``t`` in [0, 1] and the norm there.

    Args:
        sink (Tensor): ``(..., d)`` the sink's projected value ``vt_s``.
        rest (Tensor): ``(..., d)`` the renormalised mix of the other values ``u``.
    Returns:
        ``(t_star, norm_at_t_star)``, each ``(...)``.
    """
    difference = sink - rest
    curvature = (difference * difference).sum(-1)
    t_star = safe_divide(-(difference * rest).sum(-1), curvature).clamp(0, 1)
    norm = (t_star[..., None] * sink + (1 - t_star[..., None]) * rest).norm(dim=-1)
    return t_star, norm


@dataclass
class SinkAnalysis:
    r"""
    Everything :func:`analyze_sinks` measured, per layer (for one example).

    Attributes:
        received (Tensor): ``(n_layers, n)`` received attention mass of each key.
        sinks (list[list[int]]): sink positions per layer.
        factors (dict[str, Tensor]): ``"attention"``, ``"relative_norm"``, ``"cosine"``, ``"cw"``, each
                    ``(n_layers, 2)``: mean over heads, rows and keys of [sinks, other tokens]
                    (NaN for the sinks of a layer without sinks).
        cos_sink_rest (Tensor): ``(n_layers, n_heads)`` mean cos(vt_s, sum of non-sink alpha vt).
        cos_sink_output (Tensor): ``(n_layers, n_heads)`` mean cos(vt_s, o_h).
        sink_rate (Tensor): ``(n_layers, n_heads, n)`` the actual alpha_is per row (sink = strongest sink).
        optimal_rate (Tensor): ``(n_layers, n_heads, n)`` t* per row.
        output_norm (Tensor): ``(n_layers, n_heads, n)`` ||o_h|| at the actual rate.
        optimal_norm (Tensor): ``(n_layers, n_heads, n)`` ||o_h|| at t*.
    """

    received: Tensor
    sinks: list[list[int]]
    factors: dict[str, Tensor]
    cos_sink_rest: Tensor
    cos_sink_output: Tensor
    sink_rate: Tensor
    optimal_rate: Tensor
    output_norm: Tensor
    optimal_norm: Tensor


def analyze_sinks(
    model: nn.Module, input_ids: Tensor, threshold: float = 0.3, method: str = "mass"
) -> SinkAnalysis:
    r"""
    Detects the sinks of every layer of one sequence and measures them, in one forward pass.

    Args:
        model (nn.Module): a transformers model of a registered architecture.
        input_ids (Tensor): ``(n,)`` or ``(1, n)`` token ids (one sequence; a batch is refused).
        threshold (float, optional): received mass above which a key is a sink. Default: 0.3
        method (str, optional): ``"mass"`` (threshold) or ``"first"`` (the first token). Default: ``"mass"``
    """
    if method not in ("mass", "first"):
        raise InputError(f"method must be 'mass' or 'first', got {method!r}.")
    if not 0 < threshold < 1:
        raise InputError(f"threshold is a share of the attention mass, in (0, 1), got {threshold}.")
    layers = find_attention_layers(model)
    ids = _one_sequence(input_ids, "analyze_sinks").to(next(model.parameters()).device)
    rows_out: dict[int, dict[str, Tensor]] = {}

    def on_chunk(k: int, rows: Tensor, geometry: HeadGeometry) -> None:
        rows_out[k] = _measure_layer(geometry, threshold, method)

    scan_geometry(model, layers, ModelInputs(ids, {"use_cache": False}, None), (), None, on_chunk,
                  chunk_size=ids.shape[1])
    ordered = [rows_out[k] for k in range(len(layers))]
    stack = lambda name: torch.stack([layer[name] for layer in ordered]).cpu()  # noqa: E731
    return SinkAnalysis(
        received=stack("received"),
        sinks=[layer["sinks"].tolist() for layer in ordered],
        factors={name: stack(name) for name in ("attention", "relative_norm", "cosine", "cw")},
        cos_sink_rest=stack("cos_sink_rest"),
        cos_sink_output=stack("cos_sink_output"),
        sink_rate=stack("sink_rate"),
        optimal_rate=stack("optimal_rate"),
        output_norm=stack("output_norm"),
        optimal_norm=stack("optimal_norm"),
    )


def _one_sequence(input_ids: Tensor, function: str) -> Tensor:
    r"""``input_ids`` ``(n,)`` or ``(1, n)`` as ``(1, n)``; a batch of several sequences is refused, since
    flattening it would make one sequence of them all."""
    if input_ids.dim() == 0 or input_ids.dim() > 2 or (input_ids.dim() == 2 and input_ids.shape[0] != 1):
        raise InputError(f"{function} takes one sequence, (n,) or (1, n) token ids, got shape "
                         f"{tuple(input_ids.shape)}; loop over the batch and pass each sequence alone.")
    return input_ids.reshape(1, -1)


def _measure_layer(geometry: HeadGeometry, threshold: float, method: str) -> dict[str, Tensor]:
    alpha = geometry.alpha[0]  # [head, query, key]
    n = alpha.shape[-1]
    received = alpha.mean((0, 1))  # [key]
    if method == "first":
        sinks = torch.tensor([0], device=alpha.device)
    else:
        sinks = (received > threshold).nonzero().flatten()
    strongest = int(received.argmax()) if method == "mass" else 0
    is_sink = torch.zeros(n, dtype=torch.bool, device=alpha.device)
    is_sink[sinks] = True

    attention, relative_norm, cosine = (f[0] for f in geometry.decomposition("head"))  # [head, query, key]
    cw = geometry.cw_intra()[0]
    visible = alpha > 0  # keys a row actually reads

    def group_means(values: Tensor) -> Tensor:
        sink_mean = values[:, :, is_sink][visible[:, :, is_sink]].mean() if is_sink.any() else values.new_tensor(
            float("nan"))  # no sink in this layer: left out of the means over texts
        rest_mean = values[:, :, ~is_sink][visible[:, :, ~is_sink]].mean()
        return torch.stack([sink_mean, rest_mean])

    # vt of the strongest sink and the alpha-weighted non-sink mix, per head and row
    values = geometry.values[0]  # [head, key, d_head]
    projections = geometry.head_projections  # [head, d_head, d_model]
    sink_vt = torch.einsum("hd,hdm->hm", values[:, strongest], projections)  # [head, d_model]
    rest_alpha = alpha.masked_fill(is_sink[None, None, :], 0.0)
    rest_mix = torch.einsum("hqk,hkd,hdm->hqm", rest_alpha, values, projections)  # [head, query, d_model]
    head_out = geometry.head_outputs[0]  # [head, query, d_model]
    real_rows = alpha.sum(-1) > 0  # [head, query]

    def mean_cos(a: Tensor, b: Tensor) -> Tensor:
        cos = safe_divide((a * b).sum(-1), a.norm(dim=-1) * b.norm(dim=-1))  # [head, query]
        return (cos * real_rows).sum(-1) / real_rows.sum(-1).clamp_min(1)

    rate = alpha[:, :, strongest]  # [head, query]
    others = torch.einsum("hqk,hkd,hdm->hqm", alpha.index_fill(-1, torch.tensor([strongest], device=alpha.device), 0.0),
                          values, projections)
    rest_normalised = safe_divide(others, (1 - rate)[..., None])
    optimal_rate, optimal_norm = optimal_sink_rate(sink_vt[:, None, :].expand_as(rest_normalised), rest_normalised)
    return {
        "received": received,
        "sinks": sinks.cpu(),
        "attention": group_means(attention),
        "relative_norm": group_means(relative_norm),
        "cosine": group_means(cosine),
        "cw": group_means(cw),
        "cos_sink_rest": mean_cos(sink_vt[:, None, :].expand_as(rest_mix), rest_mix),
        "cos_sink_output": mean_cos(sink_vt[:, None, :].expand_as(head_out), head_out),
        "sink_rate": rate,
        "optimal_rate": optimal_rate,
        "output_norm": head_out.norm(dim=-1),
        "optimal_norm": optimal_norm,
    }


@contextmanager
def scale_sink_values(
    model: nn.Module, sink: int | Tensor, factor: float = 0.0, layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> Iterator[None]:
    r"""
    Inside the ``with`` block the sink's value vector is scaled by ``factor`` (0 removes its norm) at the
    chosen layers and heads; attention weights are unchanged, so ``o_h,i`` becomes
    ``o_h,i - (1 - factor) alpha_is vt_s``.

    Args:
        model (nn.Module): a transformers model of a registered architecture.
        sink (int or Tensor): the sink position, or ``(batch,)`` positions.
        factor (float, optional): the scale of the sink's value. Default: 0.0
        layers (Sequence[int], optional): default all; negative indices count from the end.
        heads (Sequence[int], optional): default all.
    """
    attention_layers = find_attention_layers(model)
    chosen = select_indices(layers, len(attention_layers), "layer")

    def on_call(call: AttentionCall) -> Tensor:
        batch = call.query.shape[0]
        positions = torch.as_tensor(sink, device=call.query.device).reshape(-1).expand(batch)
        rows = torch.arange(call.query.shape[2], device=call.query.device)
        alpha = call.alpha(rows)  # [batch, head, query, key]
        keep = torch.zeros(call.n_heads, dtype=torch.bool, device=alpha.device)
        keep[list(range(call.n_heads)) if heads is None else list(heads)] = True
        batch_index = torch.arange(batch, device=alpha.device)
        sink_alpha = alpha[batch_index, :, :, positions] * keep[None, :, None]  # [batch, head, query]
        sink_value = call.values()[batch_index, :, positions]  # [batch, head, d_head]
        change = (1 - factor) * sink_alpha[..., None] * sink_value[:, :, None, :]  # [batch, head, query, d_head]
        return (call.output.to(change.dtype) - change.transpose(1, 2)).to(call.output.dtype)

    with capture_attention(model, [attention_layers[index].attention for index in chosen], on_call):
        yield


@dataclass
class SinkNormEffect:
    r"""
    What removing (scaling) the sink's value norm does, for one sequence, beside two controls: the same
    scaling of a matched non-sink token (the *control*) and the sink's removal with renormalisation.

    Attributes:
        sink (int): the sink position used.
        nll (tuple[float, float]): mean next-token NLL before and after scaling the sink's value (the whole
                    model run).
        norm (Tensor): ``(2, n_layers, n_heads)`` mean ``||o_h||`` over rows, before and after.
        cosine (Tensor): ``(2, n_layers, n_heads)`` mean cos(o_h, semantic direction) before and after,
                    the semantic direction of a row being the mean of its visible non-sink ``vt_j``.
        low_norm (Tensor): ``(n_layers, n_heads)`` bool, heads in the lowest quartile of mean norm of their layer.
        control (int): the matched non-sink position (:func:`matched_control`); -1 where the sequence has no
                    other token.
        control_nll (float): mean NLL after scaling the control's value instead (NaN without a control).
        control_norm (Tensor): ``(2, n_layers, n_heads)`` as ``norm``, for the control's scaling.
        control_cosine (Tensor): ``(2, n_layers, n_heads)`` as ``cosine`` (the same semantic direction), for
                    the control's scaling.
        renormalized_nll (float): mean NLL after removing the sink key from every row at the chosen layers and
                    heads, the row's other weights rescaled to sum to 1 (softmax without the sink).
        value_norm (tuple[float, float]): mean ``||vt||`` over the chosen layers and heads of the sink and of
                    the control (how well they are matched).

    The norms and cosines are the direct effect at each layer (``o_h - (1 - factor) alpha_s vt_s`` on the
    clean activations); the NLLs include every downstream effect.
    """

    sink: int
    nll: tuple[float, float]
    norm: Tensor
    cosine: Tensor
    low_norm: Tensor
    control: int
    control_nll: float
    control_norm: Tensor
    control_cosine: Tensor
    renormalized_nll: float
    value_norm: tuple[float, float]

    @property
    def delta_perplexity(self) -> float:
        r"""Perplexity after the sink's value scaling minus before."""
        return _perplexity_change(self.nll[0], self.nll[1])

    @property
    def control_delta_perplexity(self) -> float:
        r"""Perplexity after the control's value scaling minus before (NaN without a control)."""
        return _perplexity_change(self.nll[0], self.control_nll)

    @property
    def renormalized_delta_perplexity(self) -> float:
        r"""Perplexity after removing the sink with renormalisation minus before."""
        return _perplexity_change(self.nll[0], self.renormalized_nll)


def _perplexity_change(before: float, after: float) -> float:
    return float(torch.tensor(after, dtype=torch.float64).exp() - torch.tensor(before, dtype=torch.float64).exp())


def matched_control(value_norms: Tensor, received: Tensor, sink: int, threshold: float = 0.3) -> int:
    r"""
    The control token of a sink: among the positions that are a sink in no layer (received mass at most
    ``threshold`` everywhere) and are not the sink, the one whose mean value norm ``||vt_j||`` is closest to
    the sink's (the earliest on a tie). Matching the norm makes removing the control's norm take out a term
    of the sink's size where attention is ordinary, which separates what the sink's place in the attention
    does from what removing any such term does.

    Args:
        value_norms (Tensor): ``(n,)`` mean ``||vt_j||`` of each position over layers and heads.
        received (Tensor): ``(n_layers, n)`` received attention mass of each key.
        sink (int): the sink position.
        threshold (float, optional): received mass above which a key is a sink. Default: 0.3
    Returns:
        The control position, or -1 when no position qualifies.
    """
    candidates = (received <= threshold).all(0)  # [key]
    candidates[sink] = False
    if not candidates.any():
        return -1
    distance = (value_norms - value_norms[sink]).abs().masked_fill(~candidates, float("inf"))  # [key]
    return int(distance.argmin())


def sink_norm_effect(
    model: nn.Module, input_ids: Tensor, sink: int | None = None, factor: float = 0.0,
    layers: Sequence[int] | None = None, heads: Sequence[int] | None = None, control: int | None = None,
    threshold: float = 0.3,
) -> SinkNormEffect:
    r"""
    Scales the sink's value vector by ``factor`` at ``layers`` (default all) and measures the change of
    perplexity, of the heads' output norms and of their cosine to the semantic direction; does the same
    for a control token, and measures the perplexity with the sink removed from the attention and each row
    renormalised.

    Args:
        model (nn.Module): a causal language model of a registered architecture.
        input_ids (Tensor): ``(n,)`` or ``(1, n)`` token ids (one sequence).
        sink (int, optional): the sink position. Default: the key with the most received
                    attention mass over all layers.
        factor (float, optional): scale of the sink's (and the control's) value (0 removes its norm). Default: 0.0
        layers (Sequence[int], optional): where to intervene; negative indices count from the end. Default: all.
        heads (Sequence[int], optional): which heads to intervene on. Default: all.
        control (int, optional): the control position. Default: :func:`matched_control` on the value norms
                    and received masses of the chosen layers and heads.
        threshold (float, optional): received mass above which a key counts as a sink, for the default
                    control. Default: 0.3
    """
    attention_layers = find_attention_layers(model)
    chosen = select_indices(layers, len(attention_layers), "layer")
    ids = _one_sequence(input_ids, "sink_norm_effect").to(next(model.parameters()).device)
    n = ids.shape[1]
    measured: dict[int, HeadGeometry] = {}
    received: dict[int, Tensor] = {}

    def on_chunk(k: int, rows: Tensor, geometry: HeadGeometry) -> None:
        received[k] = geometry.alpha[0].mean((0, 1))
        measured[k] = geometry  # the direct effect needs the sink, known after the pass

    output = scan_geometry(model, [attention_layers[i] for i in chosen], ModelInputs(ids, {"use_cache": False}, None),
                           (), None, on_chunk, chunk_size=n)
    received_mass = torch.stack([received[k] for k in range(len(chosen))])  # [layer, key]
    if sink is None:
        sink = int(received_mass.mean(0).argmax())
    _check_position(sink, n, "sink")
    if control is not None:
        _check_position(control, n, "control")
    value_norms = torch.stack([_value_norms(measured[k], heads) for k in range(len(chosen))]).mean(0)  # [key]
    if control is None:
        control = matched_control(value_norms, received_mass, sink, threshold)
    nll_before = _nll(ids[0], output.logits[0])
    nll_sink = _scaled_nll(model, ids, sink, factor, chosen, heads)
    nll_control = _scaled_nll(model, ids, control, factor, chosen, heads) if control >= 0 else float("nan")
    nll_renormalized = _renormalized_nll(model, ids, sink, chosen, heads, measured[0].alpha.shape[1])
    sink_change = _direct_effects(measured, sink, sink, factor, heads)
    control_change = (_direct_effects(measured, control, sink, factor, heads) if control >= 0
                      else (sink_change[0], torch.full_like(sink_change[1], float("nan"))))
    norm, cosine = sink_change  # each [2, layer, head]
    low_norm = norm[0] <= norm[0].quantile(0.25, dim=-1, keepdim=True)
    return SinkNormEffect(sink, (nll_before, nll_sink), norm, cosine, low_norm, control, nll_control,
                          *control_change, nll_renormalized,
                          (float(value_norms[sink]), float(value_norms[control]) if control >= 0 else float("nan")))


def _check_position(position: int, n: int, name: str) -> None:
    if not 0 <= position < n:
        raise InputError(f"{name} must be a position of the sequence, in [0, {n}), got {position}; count from 0.")


def _value_norms(geometry: HeadGeometry, heads: Sequence[int] | None) -> Tensor:
    r"""``(n,)`` mean over the chosen heads of ``||vt_j||`` at one layer."""
    vt = torch.einsum("hkd,hdm->hkm", geometry.values[0], geometry.head_projections)  # [head, key, d_model]
    norms = vt.norm(dim=-1)  # [head, key]
    return (norms if heads is None else norms[list(heads)]).mean(0).cpu()


def _scaled_nll(model: nn.Module, ids: Tensor, position: int, factor: float, layers: Sequence[int],
                heads: Sequence[int] | None) -> float:
    r"""The mean NLL with ``position``'s value scaled by ``factor`` (:func:`scale_sink_values`)."""
    with torch.no_grad(), scale_sink_values(model, position, factor, layers, heads):
        return _nll(ids[0], model(ids, use_cache=False).logits[0])


def _renormalized_nll(model: nn.Module, ids: Tensor, sink: int, layers: Sequence[int], heads: Sequence[int] | None,
                      n_heads: int) -> float:
    r"""The mean NLL with the sink key removed from every row of the chosen heads and the rows renormalised."""
    n = ids.shape[1]
    removal = torch.zeros(1, n_heads, n, n, dtype=torch.bool, device=ids.device)  # [batch, head, query, key]
    removal[:, list(range(n_heads)) if heads is None else list(heads), :, sink] = True
    with torch.no_grad(), mask_values(model, dict.fromkeys(layers, removal), renormalize=True):
        return _nll(ids[0], model(ids, use_cache=False).logits[0])


def _direct_effects(measured: dict[int, HeadGeometry], removed: int, sink: int, factor: float,
                    heads: Sequence[int] | None) -> tuple[Tensor, Tensor]:
    r"""``(norm, cosine)``, each ``(2, n_layers, n_heads)`` before and after scaling ``removed``'s value."""
    norms, cosines = [], []
    for k in range(len(measured)):
        before, after, cos_before, cos_after = _direct_effect(measured[k], removed, sink, factor, heads)
        norms.append(torch.stack([before, after]))
        cosines.append(torch.stack([cos_before, cos_after]))
    return torch.stack(norms, 1).cpu(), torch.stack(cosines, 1).cpu()


def _nll(ids: Tensor, logits: Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits[:-1].float(), ids[1:]))


def _direct_effect(
    geometry: HeadGeometry, removed: int, sink: int, factor: float, heads: Sequence[int] | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Mean ``||o_h||`` and cos(o_h, semantic direction) over rows, ``(n_heads,)`` each, before and after
    scaling ``removed``'s value; the semantic direction leaves out ``sink`` whichever token is scaled."""
    alpha = geometry.alpha[0]  # [head, query, key]
    scaled = torch.zeros(alpha.shape[0], dtype=alpha.dtype, device=alpha.device)
    scaled[list(range(alpha.shape[0])) if heads is None else list(heads)] = 1 - factor  # [head]
    values, projections = geometry.values[0], geometry.head_projections
    head_out = geometry.head_outputs[0]  # [head, query, d_model]
    removed_vt = torch.einsum("hd,hdm->hm", values[:, removed], projections)  # [head, d_model]
    changed = head_out - scaled[:, None, None] * alpha[:, :, removed, None] * removed_vt[:, None, :]
    visible = (alpha > 0).to(alpha.dtype).index_fill(-1, torch.tensor([sink], device=alpha.device), 0.0)
    weights = safe_divide(visible, visible.sum(-1, keepdim=True))
    semantic = torch.einsum("hqk,hkd,hdm->hqm", weights, values, projections)  # mean non-sink vt per row
    rows = visible.sum(-1) > 0  # rows that see at least one non-sink token: [head, query]

    def row_mean(values: Tensor) -> Tensor:
        return (values * rows).sum(-1) / rows.sum(-1).clamp_min(1)

    def cos(a: Tensor, b: Tensor) -> Tensor:
        return safe_divide((a * b).sum(-1), a.norm(dim=-1) * b.norm(dim=-1))

    return (row_mean(head_out.norm(dim=-1)), row_mean(changed.norm(dim=-1)),
            row_mean(cos(head_out, semantic)), row_mean(cos(changed, semantic)))
