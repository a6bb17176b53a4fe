"""The Pareto plot stays readable with an outlier: one point far off in cost does not
stretch the log axis, it is drawn at the edge and named; labels do not overlap."""

import itertools

import matplotlib.pyplot as plt
import pytest

from nas.leaderboard import cost_range, pareto_figure, pareto_png
from study_helpers import recorded_study


def test_the_cost_axis_spans_the_bulk_not_one_far_point():
    bulk = [0.05, 0.1, 0.3, 0.6, 1.0]
    low, high = cost_range(bulk)
    assert low < 0.05 and high > 1.0 and low > 0.03 and high < 1.5
    assert cost_range([1e-4, *bulk]) == (low, high)  # logistic regression's tiny cost
    assert cost_range([*bulk, 500.0]) == (low, high)
    assert cost_range([1e-4, 1.0])[0] < 1e-4  # two points: both are the spread
    assert cost_range([1e-4, 2e-4, *bulk])[0] < 1e-4  # not one point: kept


def test_the_ne_axis_leaves_a_far_worse_point_at_its_edge():
    from nas.leaderboard import ne_ceiling

    bulk = [0.851, 0.852, 0.855, 0.860, 0.870]
    assert ne_ceiling(bulk) == float("inf")  # nothing far off: nothing clipped
    assert ne_ceiling([*bulk, 0.95]) == pytest.approx(0.870 + 0.1 * 0.019)
    assert ne_ceiling([*bulk, 0.95, 1.3]) == ne_ceiling([*bulk, 0.95])
    assert ne_ceiling([0.85, 0.95]) == float("inf")  # two points: both are the spread
    assert ne_ceiling([0.85, 0.85, 0.95]) == pytest.approx(0.85 * 1.002)  # above, not level
    # a seed mean made inf by a nan run: at the edge, even beside two points (it was drawn
    # at y = inf, that is nowhere, its label too)
    inf = float("inf")
    assert ne_ceiling([0.85, 0.86, inf]) == pytest.approx(0.86 + 0.002 * 0.86)
    assert ne_ceiling([*bulk, inf, inf]) == pytest.approx(0.870 + 0.1 * 0.019)
    assert ne_ceiling([inf]) == 1.0


@pytest.fixture
def outlier_study(tmp_path):
    trials = [(0.860, 0.50), (0.855, 0.55), (0.852, 0.60), (0.851, 0.62), (0.870, 0.58)]
    baselines = {"dlrm": (0.853, 0.52), "deepfm": (0.856, 0.54),
                 "logistic_regression": (0.95, 1e-4)}  # fmt: skip
    return recorded_study(f"sqlite:///{tmp_path / 's.db'}", trials, baselines)


def test_the_pareto_plot_draws_an_outlier_at_the_edge_and_labels_apart(outlier_study):
    figure = pareto_figure(outlier_study)
    axes = figure.axes[0]
    low, high = axes.get_xlim()
    assert 0.3 < low < 0.5 and 0.62 < high < 1.0  # not stretched to 1e-4
    texts = {t.get_text(): t for t in axes.texts}
    outlier = next(t for name, t in texts.items() if name.startswith("logistic_regression"))
    assert "0.0001 MFLOPs" in outlier.get_text() and outlier.xy[0] == pytest.approx(low)
    # nor is the NE axis stretched to its 0.95: it sits at the top edge, its NE named
    assert "(0.0001 MFLOPs, NE 0.950)" in outlier.get_text() and axes.get_ylim()[1] < 0.9
    assert {"dlrm", "deepfm", "0", "1", "2", "3"} <= set(texts)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in axes.texts]
    assert not [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]
    plt.close(figure)
    assert pareto_png(outlier_study).startswith(b"\x89PNG")


def test_a_far_bayes_floor_is_named_not_drawn_and_labels_keep_off_the_markers(tmp_path):
    """The floor at 0.81 pushed points at 0.93-0.95 into the top tenth of the plot, and a
    baseline's label sat under a trial's marker ("dcn" and a dot; a user trial)."""
    import numpy as np

    from nas.trial_record import StudyAttr

    trials = [(0.860, 0.50), (0.855, 0.55), (0.852, 0.60), (0.851, 0.62), (0.870, 0.58),
              (0.8536, 0.53), (0.8566, 0.555)]  # the last two where dlrm's label went  # fmt: skip
    baselines = {"dlrm": (0.853, 0.52), "deepfm": (0.856, 0.54)}
    study = recorded_study(f"sqlite:///{tmp_path / 's.db'}", trials, baselines)
    study.set_user_attr(StudyAttr.BAYES_NE, 0.5)
    figure = pareto_figure(study)
    axes = figure.axes[0]
    assert axes.get_ylim()[0] > 0.8
    assert "Bayes-optimal NE 0.500 (below the axis)" in [
        t.get_text() for t in axes.get_legend().get_texts()
    ]
    renderer = figure.canvas.get_renderer()
    marked = [np.column_stack(line.get_data()) for line in axes.get_lines()
              if line.get_marker() not in ("None", None, "")]  # the front's  # fmt: skip
    offsets = [c.get_offsets() for c in axes.collections]
    centres = np.concatenate([axes.transData.transform(xy) for xy in [*offsets, *marked]])
    for text in axes.texts:
        box, own = text.get_window_extent(renderer), axes.transData.transform(text.xy)
        inside = [c for c in centres if box.contains(*c) and not np.allclose(c, own)]
        assert not inside, (text.get_text(), inside)
    plt.close(figure)
    study.set_user_attr(StudyAttr.BAYES_NE, 0.84)  # near the points: drawn
    figure = pareto_figure(study)
    assert any(line.get_ydata()[0] == 0.84 for line in figure.axes[0].get_lines())
    plt.close(figure)
    one = recorded_study(f"sqlite:///{tmp_path / 'one.db'}", [(0.85, 0.5)], {})
    one.set_user_attr(StudyAttr.BAYES_NE, 0.83)  # one point has no spread: still drawn
    figure = pareto_figure(one)
    assert any(line.get_ydata()[0] == 0.83 for line in figure.axes[0].get_lines())
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert "other trials" not in legend  # every trial is on the front: none drawn grey
    plt.close(figure)


def test_the_cost_axis_labels_are_plain_numbers_that_keep_apart():
    """Labels like `3×10⁻²` and `4×10⁻²` on a log axis of a decade or so ran into each other."""
    import matplotlib.pyplot as plt

    from nas.leaderboard import _keep_apart, _plain_log_labels

    for low, high, shown in ((0.025, 0.5, {"0.03", "0.05", "0.1", "0.2", "0.3", "0.5"}),
                             (0.38, 0.45, {"0.38", "0.4", "0.42", "0.45"}),
                             (0.01, 400.0, {"0.1", "1", "10", "100"}),
                             (2e5, 3e6, {"200k", "300k", "500k", "1M", "2M", "3M"}),
                             (8.5e6, 5e7, {"10M", "20M", "30M", "50M"})):  # fmt: skip
        figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
        axes.scatter([low, high], [0.9, 0.95])
        axes.set_xscale("log")
        axes.set_xlim(low, high)
        _plain_log_labels(axes.xaxis, low, high)
        figure.canvas.draw()
        _keep_apart(axes.xaxis)
        ticks = [*axes.get_xticklabels(), *axes.get_xticklabels(minor=True)]
        labels = [t for t in ticks if t.get_text() and t.get_visible()
                  and low <= t.get_position()[0] <= high]  # fmt: skip
        assert shown <= {t.get_text() for t in labels}, (low, high, labels)
        boxes = [t.get_window_extent() for t in labels]
        assert not [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]
        plt.close(figure)
