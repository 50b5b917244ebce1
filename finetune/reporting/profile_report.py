"""`finetune profile`'s table: the profile dict of commands/profile.py, one readable row per figure.

Figures that cannot be exact say so in their row (estimates, upper bounds, what was assumed): a profile is read
to decide whether to start a run, and a number without its caveat would be trusted too much.
"""

from __future__ import annotations

from rich.table import Table

SI_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str) -> str:
    """1.23e9, "FLOP" -> "1.23 GFLOP"."""
    for scale, prefix in SI_PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def duration(seconds: float) -> str:
    """A duration for people: µs, ms, s, min or h."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def profile_tables(profile: dict, recipe_path: str) -> list[Table]:
    """One table per training stage (an ulmfit recipe has three)."""
    stages = profile.get("stages", [profile])
    return [stage_table(stage, recipe_path) for stage in stages]


def stage_table(stage: dict, recipe_path: str) -> Table:
    """The rows of one stage."""
    section = f" {stage['section']}:" if "section" in stage else ""
    table = Table(
        title=f"finetune profile {recipe_path}:{section} {stage['stage']}", show_header=False, title_justify="left"
    )
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # paths are read from here: never cut them
    for name, value in stage_rows(stage):
        table.add_row(name, value)
    return table


Row = tuple[str, str]


def stage_rows(stage: dict) -> list[Row]:
    """(label, text) rows: model, parameters, FLOPs, memory, time."""
    parameters, compute = stage["parameters"], stage["compute"]
    # Frozen groups at the start (gradual unfreezing): the figures at the start are shown beside the full ones.
    frozen_at_start = parameters["trainable_groups_at_start"] < parameters["layer_groups"]
    adapter = parameters.get("adapter")
    return [
        *model_rows(stage["model"], parameters),
        *compute_rows(compute, frozen_at_start, bool(adapter)),
        *memory_rows(stage["memory_mb"], frozen_at_start, bool(adapter)),
        time_row(stage["time_estimate"], compute, frozen_at_start),
    ]


def model_rows(model: dict, parameters: dict) -> list[Row]:
    """The model, where its sizes come from, its parameters (an adapter's line among them) and those trained first."""
    sizes = ", ".join(
        f"{name.replace('_', ' ')} {value:,}" for name, value in model["sizes"].items() if value is not None
    )
    groups, trainable = parameters["layer_groups"], parameters["trainable_groups_at_start"]
    rows = [
        ("model", f"{model['family']}, {model['kind']}: {sizes}"),
        ("sizes from", model["source"] + "; built on the meta device (no weights read)"),
        (
            "parameters",
            f"{parameters['total']:,}: embeddings {parameters['embeddings']:,}, the rest {parameters['other']:,}",
        ),
        (
            "trainable at start",
            f"{parameters['trainable_at_start']:,} ({trainable} of {groups} layer groups"
            + (", gradual unfreezing)" if trainable < groups else ")"),
        ),
    ]
    adapter = parameters.get("adapter")
    if adapter:  # its line as the run prints it, and what a LoRA step computes that FLOPs count differently
        rows.insert(2, ("adapter", adapter.removeprefix("adapter: ")))
    return rows


def compute_rows(compute: dict, frozen_at_start: bool, adapter: bool) -> list[Row]:
    """FLOPs per token (how they are counted), per step and for the run when its steps are known."""
    rows: list[Row] = []
    decoded = compute["decoded_fraction"]
    how = "forward + backward"
    if decoded is not None and decoded < 1:
        how += f"; the decoder only at the {decoded:.0%} masked positions, as the sparse MLM runs it"
    elif decoded is None:
        how += f"; examples padded to at most {compute['sequence_length']} tokens, head once per example"
        if compute.get("whole_documents"):
            how += " (whole documents: counted at that length; task.max_length sets it)"
    if adapter:
        how += "; frozen weights: forward and the input's gradient, no weight gradient"
    rows.append(("FLOPs per token", f"{si(compute['flops_per_token'], 'FLOP')} ({how})"))
    if frozen_at_start:
        rows.append(("  at start", f"{si(compute['flops_per_token_at_start'], 'FLOP')} (frozen groups: forward only)"))
    unit = "tokens" if decoded is not None else "tokens at most"
    rows.append(
        (
            "per step",
            (
                f"{compute['examples_per_step']:,} x {compute['sequence_length']:,} = "
                f"{compute['tokens_per_step']:,} {unit} (per process), {si(compute['flops_per_step'], 'FLOP')}"
            ),
        )
    )
    if compute["total_flops"] is not None:
        runs = f" x {compute['runs']} runs" if compute["runs"] > 1 else ""
        bound = ", an upper bound: every group trainable" if frozen_at_start else ""
        rows.append(
            (
                "run",
                (
                    f"{compute['steps']:,} steps (training.max_steps, whatever the epochs){runs}: "
                    f"{si(compute['total_flops'], 'FLOP')}{bound}"
                ),
            )
        )
    else:
        rows.append(
            (
                "run",
                (
                    "per-step figures only: the steps per epoch depend on the data, which profile does not "
                    "read (training.max_steps gives totals)"
                ),
            )
        )
    return rows


def memory_rows(memory: dict, frozen_at_start: bool, adapter: bool) -> list[Row]:
    """fp32 weights, gradients and AdamW state, the activations' estimate and the total."""
    return [
        (
            "memory (fp32)",
            f"weights {memory['weights']:,.1f} MB, gradients {memory['gradients']:,.1f} MB, AdamW "
            f"{memory['adamw']:,.1f} MB"
            + (
                f" (at start {memory['gradients_at_start']:,.1f} and {memory['adamw_at_start']:,.1f} MB)"
                if frozen_at_start
                else ""
            )
            + ("; gradients and AdamW of the adapter's trainable parameters only" if adapter else ""),
        ),
        (
            "activations",
            f"~{memory['activations_estimate']:,.0f} MB per micro-batch"
            + (f" (~{memory['activations_estimate_at_start']:,.0f} MB at start)" if frozen_at_start else "")
            + " (a rough estimate: what the layers keep for the backward pass, fp32)",
        ),
        ("memory total", f"~{memory['total_estimate']:,.0f} MB (estimate)"),
    ]


def time_row(time: dict, compute: dict, frozen_at_start: bool) -> Row:
    """The time per step (and for the run) at the matmul rate measured or given and the MFU assumed."""
    threads = time["threads"]
    where = f"{time['device']} with {threads} thread{'s' if threads > 1 else ''}" if threads else time["device"]
    rate = f"{time['matmul_gflops']:,.0f} GFLOP/s {time['precision']} matmul " + (
        f"measured here on {where}" if time["matmul_measured"] else "given"
    )
    step = f"~{duration(time['seconds_per_step'])} per step"
    if frozen_at_start:
        step += f" (~{duration(time['seconds_per_step_at_start'])} at start)"
    if time["seconds_total"] is not None:
        runs = f" x {compute['runs']} runs" if compute["runs"] > 1 else ""
        step += f", ~{duration(time['seconds_total'])} for {compute['steps']:,} steps{runs}"
    return ("time", f"{step} (estimate: {rate}, {time['mfu_assumed']:.0%} MFU assumed)")
