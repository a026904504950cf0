"""The front plot and page: every trial labelled, nothing clipped, kinds and the limit in the space's unit."""

from __future__ import annotations

import math

import pytest

from precsearch.tracking.front_report import KINDS, front_figure, write_front


def _row(trial, memory, instability, *, feasible=True, pareto=False, diverged=False, floor=0.01):
    return {"trial": trial, "fidelity_steps": 12, "pareto": pareto, "feasible": feasible, "diverged": diverged,
            "memory_saved": memory, "instability": instability, "loss_gap": instability, "tokens_per_s": 100.0,
            "policy": f"mlp=fp8_delayed <{trial}>", "params": {}, "noise_floor": floor}


ROWS = [_row(0, 0.0, 0.0005, pareto=True), _row(1, 0.0177, 0.0002, pareto=True), _row(2, 0.0, 0.0005, pareto=True),
        _row(3, 0.05, 0.004), _row(4, 0.11, 0.03, feasible=False), _row(5, 0.08, 1.0, feasible=False, diverged=True),
        _row(6, 0.06, 0.0095) | {"instability_band": "near the limit"}]  # feasible, but not clear of the limit


@pytest.fixture
def figure():
    fig = front_figure(ROWS, 0.01)
    yield fig
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_every_trial_is_labelled_and_coincident_trials_share_a_label(figure):
    # the old plot numbered only the front's points
    texts = [t.get_text() for t in figure.axes[0].texts]
    labelled = {int(n) for text in texts for n in text.split(" (")[0].split(",")}
    assert labelled == {r["trial"] for r in ROWS}
    assert "0,2" in texts  # trials 0 and 2 scored the same: one label, both numbers


def test_nothing_is_clipped(figure):
    # the old plot cut an 11% point's label at the top edge
    renderer = figure.canvas.get_renderer()
    page = figure.bbox
    for artist in figure.axes[0].texts + figure.axes[0].lines + [figure.axes[0].get_legend()]:
        box = artist.get_window_extent(renderer)
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, \
            artist
    ax = figure.axes[0]
    low, high = ax.get_ylim()
    drawn = {line.get_gid(): line.get_ydata()[0] for line in ax.lines if line.get_gid()}
    assert len(drawn) == len(ROWS) and all(low <= y <= high for y in drawn.values())


def test_the_y_axis_is_linear_and_a_trial_above_it_is_on_the_top_edge_with_its_value(figure):
    """The symlog axis spaced 0-1 evenly and squeezed 1-2 with no note; linear, the diverged trial's 100%
    would flatten the others, so it sits on the top edge as a triangle, its value in its label."""
    ax = figure.axes[0]
    assert ax.get_yscale() == "linear"
    diverged = next(line for line in ax.lines if line.get_gid() == "trial-5")
    assert diverged.get_ydata()[0] == pytest.approx(ax.get_ylim()[1]) and diverged.get_marker() == "^"
    assert "5 (1)" in [t.get_text() for t in ax.texts]  # a fraction of the BF16 loss, the study's unit
    assert ax.get_ylim()[1] < 0.1  # the 3% trial and the 1% limit keep the axis, not the 100%
    assert "linear" in ax.get_ylabel()


def test_the_legend_is_below_the_plot_inside_the_figure(figure):
    """A legend right of the axes made the PNG wider than MLflow's artifact viewer, which cut it off."""
    legend = figure.axes[0].get_legend().get_window_extent(figure.canvas.get_renderer())
    axes = figure.axes[0].get_window_extent(figure.canvas.get_renderer())
    assert legend.y1 <= axes.y0 and figure.bbox.width <= 620


def test_kinds_are_told_apart_and_the_limit_is_drawn_in_the_study_unit(figure):
    ax = figure.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert set(KINDS) <= set(labels)
    limit = [line for line in ax.lines if line.get_label().startswith("stability limit")]
    assert limit and limit[0].get_ydata()[0] == pytest.approx(0.01)  # the limit as the space states it
    assert limit[0].get_label() == "stability limit 0.01 fraction of the BF16 loss"


def test_noise_unit_plots_seed_spreads_and_its_limit():
    import matplotlib.pyplot as plt

    fig = front_figure(ROWS, 2.0, unit="noise")
    ax = fig.axes[0]
    limit = next(line for line in ax.lines if line.get_label().startswith("stability limit"))
    assert limit.get_ydata()[0] == pytest.approx(2.0) and "seed spreads" in ax.get_ylabel()
    point = next(line for line in ax.lines if line.get_gid() == "trial-3")
    assert point.get_ydata()[0] == pytest.approx(0.004 / 0.01)  # instability / noise floor
    plt.close(fig)


def test_html_page_has_no_script_and_a_hover_text_per_trial(tmp_path):
    # the plotly page (4.7 MB of inline script) stayed blank in MLflow's artifact viewer
    paths = write_front(ROWS, tmp_path, 0.01)
    page = paths[3].read_text()
    assert "<script" not in page.lower()
    assert page.count('<area shape="circle"') == len(ROWS) and page.count('title="trial ') == len(ROWS)
    assert "data:image/png;base64," in page
    assert paths[3].stat().st_size < 500_000
    assert all(p.stat().st_size > 0 for p in paths)
    assert math.isfinite(len(page))


def test_the_page_table_gives_instability_in_the_plot_unit(tmp_path):
    """The page's table gave instability in % while its plot (noise unit) used seed spreads."""
    page = write_front(ROWS, tmp_path, 2.0, unit="noise")[3].read_text()
    assert "<th>instability (BF16 seed spreads)</th>" in page
    assert "<td>0.4</td><td>stable</td>" in page  # trial 3: 0.004 over a 0.01 noise floor
    assert "instability 0.4 BF16 seed spreads; limit 2: stable" in page  # its hover text too
    relative = write_front(ROWS, tmp_path, 0.01)[3].read_text()
    assert "<th>instability (fraction of the BF16 loss)</th>" in relative and "<td>0.004</td>" in relative


def test_a_damage_front_names_its_measure_on_the_axis_the_limit_and_the_page(tmp_path):
    """A study read by the fixed-state reading: its axis, limit, table and hover texts said "% of BF16 loss"
    or no unit at all; they name the measure the trials were scored in."""
    import matplotlib.pyplot as plt

    rows = [dict(r, damage_measure="update_norm") for r in ROWS]
    fig = front_figure(rows, 0.01, unit="damage")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "instability (update_norm), linear axis"
    assert any(line.get_label() == "stability limit 0.01 update_norm" for line in ax.lines)
    # the measure's description (50 characters) overflowed the 600 px figure: the axis, the legend and the title
    # stay inside it; the page beside the plot gives the description
    fig.canvas.draw()
    for text in (ax.yaxis.label, ax.get_legend(), ax.title):
        box = text.get_window_extent()
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y0 >= 0 and box.y1 <= fig.bbox.height, text
    plt.close(fig)
    page = write_front(rows, tmp_path, 0.01, unit="damage")[3].read_text()
    assert "<th>instability (update_norm (AdamW update error bias^2 / update^2))</th>" in page
    assert "BF16 loss" not in page
    assert "<td>0.004</td>" in page and "instability 0.004 update_norm (AdamW" in page


def test_front_csv_holds_what_the_probes_decide_and_speed_only_as_an_objective(tmp_path):
    """Two runs of one study differ in measured speed only: with tokens/s in it, front.csv differed every run
    (issue 53: the same command must give the same front file)."""
    fast = [r | {"tokens_per_s": 2 * r["tokens_per_s"]} for r in ROWS]
    first = write_front(ROWS, tmp_path / "a", 0.01)[0].read_text()
    assert write_front(fast, tmp_path / "b", 0.01)[0].read_text() == first
    assert "tokens_per_s" not in first.splitlines()[0]
    timed = [r | {"tokens_per_s_se": 1.5} for r in ROWS]
    searched = write_front(timed, tmp_path / "c", 0.01, throughput=True)[0].read_text().splitlines()
    header, first_row = searched[0].split(","), searched[1].split(",")
    assert first_row[header.index("tokens_per_s")] == "100.0" and first_row[header.index("tokens_per_s_se")] == "1.5"


def test_a_feasible_trial_near_the_limit_is_drawn_apart_from_the_stable_ones(figure):
    marks = {line.get_gid(): line.get_marker() for line in figure.axes[0].lines if line.get_gid()}
    assert marks["trial-6"] == KINDS["feasible, near the limit"][1] == "D"  # within the limit, interval past 90%
    assert marks["trial-3"] == KINDS["feasible"][1] == "o"
    assert "feasible, near the limit" in figure.axes[0].get_legend_handles_labels()[1]
