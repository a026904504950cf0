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
        _row(3, 0.05, 0.004), _row(4, 0.11, 0.03, feasible=False), _row(5, 0.08, 1.0, feasible=False, diverged=True)]


@pytest.fixture
def figure():
    fig = front_figure(ROWS, 0.01)
    yield fig
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_every_trial_is_labelled_and_coincident_trials_share_a_label(figure):
    # the old plot numbered only the front's points
    texts = [t.get_text() for t in figure.axes[0].texts]
    labelled = {int(n) for text in texts for n in text.split(",")}
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
    assert all(low < 100 * r["instability"] < high for r in ROWS)


def test_kinds_are_told_apart_and_the_limit_is_drawn_in_percent(figure):
    ax = figure.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert set(KINDS) <= set(labels)
    limit = [line for line in ax.lines if line.get_label().startswith("stability limit")]
    assert limit and limit[0].get_ydata()[0] == pytest.approx(1.0)  # 0.01 relative = 1%
    assert "1%" in limit[0].get_label()


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
