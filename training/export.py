"""Export trained heads as a checksummed model repository entry: one ONNX file per view and manifest.json.

Each head's graph takes the view's raw features, float32 ``(N, dim)`` with a dynamic batch axis, and returns
evidence float32 ``(N, K)``: the min-max scaling fitted on the training split and the activation are inside
the graph, so the service feeds features exactly as the data stores them. The graphs are built node by node
with ``onnx.helper`` (linear layers, ReLU, the capped exponential): small, readable, and the same bytes for
the same weights. Nothing is written unless every head matches its torch original (max relative error 1e-4)
under onnxruntime.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import platform
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fusion import Method, fuse, opinion_from_evidence
from manifest import ConflictFlag, FlagRates, FusionDefaults, Manifest, Metrics, ViewEntry
from training import data as datasets
from training.heads import EVIDENCE_CAP, ViewHead
from training.metrics import accuracy, auroc
from training.train import PAPER_HYPERPARAMETERS, TrainConfig, predict_evidence, train

PARITY_TOLERANCE = 1e-4
_OPSET = 17
_IR_VERSION = 8  # readable by every onnxruntime release since 1.10


class ParityError(RuntimeError):
    """An exported graph does not reproduce its torch head."""


def head_to_onnx(head: ViewHead, minimum: np.ndarray, maximum: np.ndarray, *, view: str):
    """The ONNX graph of ``head`` with min-max scaling (``minimum``, ``maximum`` per feature) in front.

    Input ``features`` float32 ``(batch, dim)``, output ``evidence`` float32 ``(batch, K)``.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    span = np.asarray(maximum, np.float64) - np.asarray(minimum, np.float64)
    # The scaler maps constant features to 0: multiply by 0 there instead of dividing by 0.
    inverse_span = np.where(span > 0, 1.0 / np.where(span > 0, span, 1.0), 0.0).astype(np.float32)
    constants = {"minimum": np.asarray(minimum, np.float32), "inverse_span": inverse_span}
    nodes = [
        helper.make_node("Sub", ["features", "minimum"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "inverse_span"], ["h0"]),
    ]
    linears = [module for module in head.net if isinstance(module, nn.Linear)]
    current = "h0"
    for i, linear in enumerate(linears):
        constants[f"weight{i}"] = linear.weight.detach().numpy().T.astype(np.float32)
        constants[f"bias{i}"] = linear.bias.detach().numpy().astype(np.float32)
        nodes.append(helper.make_node("MatMul", [current, f"weight{i}"], [f"product{i}"]))
        nodes.append(helper.make_node("Add", [f"product{i}", f"bias{i}"], [f"linear{i}"]))
        current = f"linear{i}"
        if i < len(linears) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"hidden{i}"]))
            current = f"hidden{i}"
    if head.activation == "exp":
        # C / (1 + C e^-x) = exp(log C - softplus(log C - x)), as training.heads.capped_exp
        constants["log_cap"] = np.array(math.log(EVIDENCE_CAP), np.float32)
        nodes += [
            helper.make_node("Sub", ["log_cap", current], ["headroom"]),
            helper.make_node("Softplus", ["headroom"], ["overshoot"]),
            helper.make_node("Sub", ["log_cap", "overshoot"], ["log_evidence"]),
            helper.make_node("Exp", ["log_evidence"], ["evidence"]),
        ]
    else:
        nodes.append(helper.make_node("Softplus", [current], ["evidence"]))
    dim = int(inverse_span.shape[0])
    classes = int(linears[-1].out_features)
    graph = helper.make_graph(
        nodes,
        f"{view}_evidential_head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", dim])],
        [helper.make_tensor_value_info("evidence", TensorProto.FLOAT, ["batch", classes])],
        initializer=[numpy_helper.from_array(value, name) for name, value in constants.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET)],
        producer_name="dbf-serve",
        ir_version=_IR_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def check_parity(
    model_bytes: bytes, head: ViewHead, raw: np.ndarray, scaled: np.ndarray, *, view: str
) -> float:
    """Largest relative error of the ONNX graph on ``raw`` against the torch head on ``scaled``.

    Raises :class:`ParityError` above :data:`PARITY_TOLERANCE`.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    exported = session.run(["evidence"], {"features": np.ascontiguousarray(raw, dtype=np.float32)})[0]
    with torch.inference_mode():
        expected = head(torch.as_tensor(scaled)).numpy()
    error = float(np.max(np.abs(exported - expected) / (np.abs(expected) + 1e-6)))
    if not error <= PARITY_TOLERANCE:
        raise ParityError(
            f"view {view}: ONNX evidence differs from torch by {error:.2e} (> {PARITY_TOLERANCE})"
        )
    return error


def calibrate_flag(
    clean: Mapping[str, np.ndarray],
    conflictive: Mapping[str, np.ndarray],
    *,
    target_false_positive_rate: float,
) -> tuple[str, float, dict[str, float]]:
    """Choose the flag's score and threshold on validation data.

    Parameters
    ----------
    clean, conflictive : dicts ``{"uncertainty": (N,), "max_conflict": (N,)}``
        Scores of clean validation samples and of their conflictive copies.

    Returns
    -------
    (score, threshold, validation AUROC per score)
        The score that separates better; the threshold flags ``target_false_positive_rate`` of the clean
        samples (``score >= threshold``).
    """
    separation = {
        name: auroc(
            np.concatenate([clean[name], conflictive[name]]),
            np.concatenate([np.zeros(len(clean[name]), bool), np.ones(len(conflictive[name]), bool)]),
        )
        for name in ("uncertainty", "max_conflict")
    }
    score = max(separation, key=separation.get)
    # With score >= threshold, this flags the target share of clean samples (more only where scores tie).
    threshold = float(np.quantile(clean[score], 1 - target_false_positive_rate, method="higher"))
    return score, threshold, separation


def flag_scores(evidence: np.ndarray, *, method: Method, lam: float) -> dict[str, np.ndarray]:
    """The flag's two candidate scores: fused uncertainty and the largest pairwise conflict, each (N,)."""
    fused = fuse(opinion_from_evidence(evidence), method, lam=lam)
    return {"uncertainty": fused.uncertainty, "max_conflict": fused.conflict.max(axis=(-1, -2))}


def export(
    dataset_name: str,
    out_dir: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str],
    method: Method = "dbf",
    lam: float = 1.0,
    config: TrainConfig | None = None,
    seed: int = 0,
    target_false_positive_rate: float = 0.05,
    name: str | None = None,
) -> Manifest:
    """Train on the held-out protocol's training split, calibrate, export and verify; write ``out_dir``.

    ``out_dir`` is replaced only once everything is written and verified (a failed export leaves any
    existing model untouched).
    """
    dataset = datasets.load(dataset_name, data_dir)
    spec = dataset.spec
    names = list(spec.view_names)
    config = config or TrainConfig(
        method=method, lam=lam, hyperparameters=PAPER_HYPERPARAMETERS[dataset_name], seed=seed
    )
    train_idx, val_idx, test_idx = datasets.stratified_split(dataset.labels, seed=seed)
    scaler = datasets.MinMaxScaler.fit(dataset.take(train_idx).views)
    scaled = scaler.transform(dataset.views)
    torch.set_num_threads(1)  # deterministic float summation order, hence the same weights and bytes
    model = train(
        [scaled[v][train_idx] for v in names],
        dataset.labels[train_idx],
        num_classes=spec.num_classes,
        config=config,
    )

    rng = np.random.default_rng(seed)
    scores = {}
    for split, idx in (("validation", val_idx), ("test", test_idx)):
        clean = {v: scaled[v][idx] for v in names}
        conflictive, _ = datasets.make_conflictive(
            clean, dataset.labels[idx], rng=rng, num_classes=spec.num_classes
        )
        scores[split] = [
            predict_evidence(model, [clean[v] for v in names]),
            predict_evidence(model, [conflictive[v] for v in names]),
        ]
    flag_inputs = {
        split: [flag_scores(e, method=method, lam=lam) for e in pair] for split, pair in scores.items()
    }
    score, threshold, separation = calibrate_flag(
        *flag_inputs["validation"], target_false_positive_rate=target_false_positive_rate
    )

    def rates(split: str) -> FlagRates:
        clean, conflictive = flag_inputs[split]
        return FlagRates(
            clean=float(np.mean(clean[score] >= threshold)),
            conflictive=float(np.mean(conflictive[score] >= threshold)),
        )

    test_clean, test_conflict = scores["test"]
    fused_clean = fuse(opinion_from_evidence(test_clean), method, lam=lam)
    fused_conflict = fuse(opinion_from_evidence(test_conflict), method, lam=lam)
    all_evidence = predict_evidence(model, [scaled[v] for v in names])
    metrics = Metrics(
        acc_normal=accuracy(fused_clean.probability, dataset.labels[test_idx]),
        acc_conflict=accuracy(fused_conflict.probability, dataset.labels[test_idx]),
        auc=auroc(
            np.concatenate([fused_clean.uncertainty, fused_conflict.uncertainty]),
            np.repeat([False, True], len(test_idx)),
        ),
        acc_all_samples=accuracy(
            fuse(opinion_from_evidence(all_evidence), method, lam=lam).probability, dataset.labels
        ),
    )

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        entries = []
        for v, head in zip(names, model.heads, strict=True):
            graph = head_to_onnx(head, scaler.minimum[v], scaler.maximum[v], view=v).SerializeToString()
            check_parity(graph, head, dataset.views[v], scaled[v], view=v)
            (staging / f"{v}.onnx").write_bytes(graph)
            entries.append(
                ViewEntry(
                    name=v,
                    dim=dataset.views[v].shape[1],
                    file=f"{v}.onnx",
                    sha256=hashlib.sha256(graph).hexdigest(),
                )
            )
        manifest = Manifest(
            name=name or dataset_name,
            dataset=dataset_name,
            classes=list(spec.class_names),
            views=entries,
            fusion=FusionDefaults(method=method, lam=lam),
            conflict_flag=ConflictFlag(
                score=score,
                threshold=threshold,
                target_false_positive_rate=target_false_positive_rate,
                validation_auroc=separation,
                validation=rates("validation"),
                test=rates("test"),
            ),
            metrics=metrics,
            training={
                "protocol": "heldout",
                "seed": seed,
                "method": config.method,
                "lambda": config.lam,
                "activation": config.activation,
                "hidden": list(config.hidden),
                "epochs": config.epochs,
                "batch_size": config.batch_size,
                "lr": config.hyperparameters.lr,
                "annealing_step": config.hyperparameters.annealing_step,
                "gamma": config.hyperparameters.gamma,
                "weight_decay": config.hyperparameters.weight_decay,
                "splits": {"train": len(train_idx), "validation": len(val_idx), "test": len(test_idx)},
            },
            provenance=_provenance(),
        )
        (staging / "manifest.json").write_text(manifest.json_text())
        staging.chmod(0o755)  # mkdtemp's 0700 would make the model private to its writer
        if out.exists():  # two renames: the old model is in place until the new one takes its name
            retired = out.with_name(f".{out.name}.retired")
            shutil.rmtree(retired, ignore_errors=True)
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired)
        else:
            staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _provenance() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("dbf-serve", "torch", "numpy", "onnx"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    # The parity check ran on whichever onnxruntime build is installed (pyproject's cpu or gpu extra).
    runtimes = {}
    for package in ("onnxruntime", "onnxruntime-gpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            runtimes[package] = metadata.version(package)
    return {**versions, **(runtimes or {"onnxruntime": "absent"})}


def exported_evidence(model_dir: str | os.PathLike[str], views: Mapping[str, np.ndarray]) -> np.ndarray:
    """Evidence ``(N, V, K)`` of an exported model on raw features (a reader for tests and checks)."""
    import onnxruntime

    model_dir = Path(model_dir)
    manifest = Manifest.model_validate_json((model_dir / "manifest.json").read_text())
    out = []
    for entry in manifest.views:
        session = onnxruntime.InferenceSession(
            str(model_dir / entry.file), providers=["CPUExecutionProvider"]
        )
        out.append(session.run(["evidence"], {"features": np.asarray(views[entry.name], np.float32)})[0])
    return np.stack(out, axis=1)


__all__: Sequence[str] = [
    "ParityError",
    "calibrate_flag",
    "check_parity",
    "export",
    "exported_evidence",
    "head_to_onnx",
]
