"""One study's best on every surface: status, leaderboard, verdict, export's choice."""

import io
import json
import math
import re
import statistics
from csv import DictReader

import optuna
import pytest

from nas.cli import main
from nas.leaderboard import (
    SIGNIFICANCE,
    best_trial,
    format_verdict,
    markdown,
    paired_seeds,
    pareto_front,
    rows,
    study_best,
    verdict,
)
from search_space.errors import RanknasError
from study_helpers import recorded_study

# trial 0: the lowest recorded NE, costly; trial 1: cheaper; trial 2: never re-evaluated
TRIALS = [(0.850, 1.0), (0.856, 0.5), (0.858, 0.3)]
# trial 1 within 0.0001-0.0002 of trial 0 on every seed: shown equivalent (a tie)
TIED = {"0": [0.8500, 0.8520, 0.8510, 0.8530], "1": [0.8502, 0.8519, 0.8511, 0.8532],
        "baseline:dlrm": [0.855, 0.856, 0.854, 0.856]}  # fmt: skip
# trial 1 0.0005 worse on average, seeds apart by up to 0.002: within seed noise (p = 0.5),
# yet not shown within 0.1% of trial 0: no tie
UNSETTLED = {"0": [0.8500, 0.8520, 0.8510, 0.8530], "1": [0.8510, 0.8520, 0.8530, 0.8520]}
APART = {"0": [0.8500, 0.8510, 0.8500, 0.8510], "1": [0.8550, 0.8560, 0.8550, 0.8570]}


def _surfaces(url: str, capsys: pytest.CaptureFixture) -> dict[str, int]:
    """The trial each surface names as the best."""
    assert main(["status", "recorded", "--storage", url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert main(["leaderboard", "recorded", "--storage", url, "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    from nas.storage import load_study

    study = load_study("recorded", url)
    named = {"status": status["best_trial"], "leaderboard": board["leaderboard"][0]["trial"],
             "leaderboard --json's best": board["best"]["trial"],
             "export --trial best": best_trial(study).number}  # fmt: skip
    if board["verdict"]:
        named["verdict"] = board["verdict"]["best_trial"]["trial"]
    return named


def test_before_reevaluate_the_best_is_the_best_recorded_run(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)})
    assert set(_surfaces(url, capsys).values()) == {0}
    best = study_best(study)
    assert best["basis"] == "recorded runs" and best["ties"] == []


def test_equivalent_seed_means_are_a_tie_that_goes_to_the_cheaper(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=TIED)
    best = study_best(study)
    assert best["trial"] == 1 and best["basis"] == "seed means over 4 fresh seeds"
    assert best["lowest"]["trial"] == 0 and [t["trial"] for t in best["ties"]] == [1]
    assert best["val_ne"] == pytest.approx(0.8516)  # its seed mean, not its recorded run
    assert set(_surfaces(url, capsys).values()) == {1}
    assert main(["status", "recorded", "--storage", url]) == 0
    said = capsys.readouterr().out
    assert "best so far: trial 1 (seed means over 4 fresh seeds)" in said
    assert "a tie, equivalent within 0.1% NE" in said and "the tie goes to the cheaper" in said


def test_seed_means_within_noise_but_not_shown_equivalent_are_no_tie(tmp_path):
    """Seeds that fail to tell two finalists apart do not make them equal: the cheaper
    does not win at a worse mean unless the difference is shown to be small."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, reevaluation=UNSETTLED)
    assert paired_seeds(study, "1", "0")["p_value"] >= SIGNIFICANCE
    best = study_best(study)
    assert best["trial"] == 0 and best["ties"] == []


def test_seed_means_beyond_noise_are_no_tie(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, reevaluation=APART)
    best = study_best(study)
    assert best["trial"] == 0 and best["ties"] == []
    assert set(_surfaces(url, capsys).values()) == {0}
    assert main(["leaderboard", "recorded", "--storage", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "mean val NE" in lines[0] and [line.split()[0] for line in lines[1:4]] == ["0", "1", "2"]


def test_the_mlflow_note_shows_the_seed_means_it_chose_by(tmp_path):
    """The parent run's note (`leaderboard.markdown`) puts each re-evaluated trial's and
    baseline's seed mean beside its single run, as the leaderboard does."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=TIED)
    note = markdown(study, rows(study))
    # the answer first: the UI folds a note after its first lines, and the verdict, below
    # two tables, went unseen
    assert note.startswith("**Best: trial ") and note.index("verdict") < note.index("```")
    trials, baselines = note.split("## Baselines")
    # aligned text in a code block: MLflow drew a Markdown table's cells without padding
    assert "```\ntrial  val NE  mean val NE  test NE" in trials
    assert "\n1      0.8560  0.8516" in trials and "\n2      0.8580  -  " in trials
    assert "\ndlrm      0.8550  0.8552" in baselines  # mean 0.85525
    assert "recorded: 3 trials, best first" in trials  # not "the best 3" of 3
    plain = recorded_study(f"sqlite:///{tmp_path / 'plain.db'}", TRIALS)
    assert "mean val NE" not in markdown(plain, rows(plain))


def test_the_model_card_tells_a_baselines_recorded_run_from_its_seed_mean(tmp_path):
    from nas.commands import _Exported, _provenance

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=TIED)
    card = _provenance(study, _Exported.of_trial(best_trial(study)), {})
    assert card["baseline dlrm val / test NE"].startswith("0.8550 / ")
    assert "(its recorded run); mean over 4 seeds 0.8552 / " in card["baseline dlrm val / test NE"]
    # the verdict as `status` tells it, each of its lines: the baselines' recipe, the seeds
    assert card["verdict"].startswith("(seed means")  # the row's name says "verdict"
    assert "; baselines untuned, at the study's recipe" in card["verdict"]
    assert "; by seed: trial 1 has the lower validation NE on 4 of 4 seeds" in card["verdict"]
    # a trial that is not the best says so, and gives its own seed mean
    other = _provenance(study, _Exported.of_trial(study.trials[0]), {})
    assert other["the study's best"].startswith("not this trial: trial 1")
    assert other["this trial's val / test NE, mean over its seeds"].startswith("0.8515")
    assert not card["the study's best"].startswith("not this trial")


def test_before_reevaluate_the_verdict_meets_the_baseline_the_study_called_best(tmp_path, capsys):
    """A study that picked its best baseline by seed means (`best_baseline.seeds`) said
    "best baseline by mean validation NE: dcnv2 0.8480, dlrm 0.8600", then "the search
    wins ... vs baseline dlrm" on dlrm's one lucky run, and "Pareto-dominated: dcnv2" on
    dcnv2's one unlucky run."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"baseline:dlrm": [0.860, 0.861, 0.859], "baseline:dcnv2": [0.848, 0.847, 0.849]}
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.853, 0.5), "dcnv2": (0.862, 2.0)},
                           reevaluation=means)  # fmt: skip
    v = verdict(study)
    assert v["basis"] == "recorded runs against the baselines' seed means over 3 seeds"
    assert v["best_baseline"]["baseline"] == "dcnv2"
    assert v["best_baseline"]["val_ne"] == pytest.approx(0.848)
    assert not v["search_lower"] and v["dominated_baselines"] == ["dlrm"]
    assert v["outcome"] == "baseline_leads"
    assert (
        "the baseline leads on single runs, not yet a verdict: trial 0 validation NE 0.8500 "
        "vs baseline dcnv2 0.8480" in format_verdict(v)
    )
    assert main(["leaderboard", "recorded", "--storage", url, "--json"]) == 0
    bases = {b["baseline"]: b for b in json.loads(capsys.readouterr().out)["baselines"]}
    assert bases["dcnv2"]["mean_val_ne"] == pytest.approx(0.848) and bases["dcnv2"]["seeds"] == 3
    assert main(["leaderboard", "recorded", "--storage", url, "--csv"]) == 0
    csv_rows = list(DictReader(io.StringIO(capsys.readouterr().out)))
    dcnv2 = next(r for r in csv_rows if r["baseline"] == "dcnv2")
    assert float(dcnv2["mean_val_ne"]) == pytest.approx(0.848) and dcnv2["seeds"] == "3"
    assert float(dcnv2["mean_test_ne"]) == pytest.approx(0.849)  # the verdict's test NE
    assert main(["leaderboard", "recorded", "--storage", url]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("baseline "))
    assert "test NE  mean test NE" in header


def test_the_leaderboard_shows_the_seed_mean_test_ne_the_verdict_reads(tmp_path, capsys):
    """After `reevaluate` the leaderboard's test NE was the recorded run's while the verdict
    quoted the seed mean's: both are columns now."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=TIED)
    assert main(["leaderboard", "recorded", "--storage", url, "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    first = board["leaderboard"][0]
    assert first["trial"] == 1 and first["mean_test_ne"] == pytest.approx(0.8516 + 0.001)
    assert board["verdict"]["best_trial"]["test_ne"] == pytest.approx(first["mean_test_ne"])
    assert main(["leaderboard", "recorded", "--storage", url]) == 0
    assert "mean test NE" in capsys.readouterr().out.splitlines()[0]


def test_the_pareto_front_takes_seed_means_where_trials_have_them(tmp_path, capsys):
    """After `reevaluate`, trial 0 (costly) stayed on the front on its recorded run though
    trial 1, cheaper, had the lower seed mean."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"0": [0.8600, 0.8610, 0.8590], "1": [0.8500, 0.8510, 0.8490]}
    study = recorded_study(url, TRIALS, reevaluation=means)
    assert [r["trial"] for r in pareto_front(study)] == [2, 1]
    assert main(["leaderboard", "recorded", "--storage", url]) == 0
    assert "Pareto front (validation NE, seed means where re-evaluated, vs MFLOPs)" in (
        capsys.readouterr().out
    )


def test_the_progress_line_names_the_best_that_status_names(tmp_path):
    """A resumed study printed "(best 0.9155)", the lowest run, while `status` named trial 1
    by its seed mean, 0.9239."""
    from nas.config import parse_config
    from nas.runner import _progress_line
    from study_helpers import tiny_config

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, reevaluation=TIED)
    config = parse_config(tiny_config(tmp_path, "recorded") | {"storage": url})
    record = {"metrics": {"val_ne": 0.858, "mflops": 0.3},
              "tags": {"status": "complete", "worker": "w"}}  # fmt: skip
    line, _, best = _progress_line(study, config, record, started=0.0)
    assert "(best: trial 1 0.8516, seed means over 4 fresh seeds)" in line
    assert best == pytest.approx(study_best(study)["val_ne"])


def test_export_of_a_repeat_is_its_original_and_a_skipped_trial_says_why(tmp_path):
    """`export --trial 2` of a repeat exported it as "trial 2" (the card never said whose
    model it was); a trial `status` called skipped was "pruned, not complete"."""
    from optuna.trial import TrialState, create_trial

    from nas.trial_record import TrialAttr
    from search_space.errors import RanknasError

    study = optuna.create_study(study_name="r", storage=f"sqlite:///{tmp_path / 's.db'}")
    study.add_trial(create_trial(value=0.9))
    study.add_trial(create_trial(value=0.9, user_attrs={TrialAttr.REUSED_FROM: 0}))
    why = "0.544 MFLOPs exceeds objectives.max_mflops=0.3"
    study.add_trial(create_trial(state=TrialState.PRUNED, user_attrs={
        TrialAttr.OVER_CONSTRAINT: True, TrialAttr.FAILURE_REASON: why}))  # fmt: skip
    assert best_trial(study, "1").number == 0
    with pytest.raises(RanknasError, match=rf"trial 2 is skipped \({why}\), not complete"):
        best_trial(study, "2")


# the baseline at 0.8 MFLOPs: trial 0 beats it beyond noise at a higher cost; trials 1 and 2
# are cheaper, 1 within seed noise of it (p = 0.64), 2 worse on every seed by 0.003-0.005
BASE_AT_08 = {"dlrm": (0.855, 0.8)}
NEAR = {
    "0": [0.8500, 0.8510, 0.8500, 0.8510],
    "1": [0.8560, 0.8550, 0.8540, 0.8570],
    "2": [0.8590, 0.8600, 0.8580, 0.8610],
    "baseline:dlrm": [0.855, 0.856, 0.854, 0.856],
}


def _costed(study):
    """A study that trades NE against MFLOPs (`objectives.cost: mflops`)."""
    study.set_user_attr("objectives", ["ne", "mflops"])
    return study


def test_the_verdict_names_the_cheapest_trial_at_the_baselines_ne(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    plain = recorded_study(url.replace("studies", "plain"), TRIALS, BASE_AT_08, NEAR)
    assert verdict(plain)["cheapest_within_noise"] is None  # no cost objective: no such line
    study = _costed(recorded_study(url, TRIALS, baselines=BASE_AT_08, reevaluation=NEAR))
    v = verdict(study)
    cheapest = v["cheapest_within_noise"]
    assert cheapest["trial"] == 1 and cheapest["cost_ratio"] == pytest.approx(0.5 / 0.8)
    assert cheapest["paired"]["p_value"] >= SIGNIFICANCE
    assert paired_seeds(study, "2", "baseline:dlrm")["p_value"] < SIGNIFICANCE  # 2: worse
    text = format_verdict(v)
    assert ("at baseline dlrm's NE (a lower seed mean, or at most 0.1% higher within seed "
            "noise): cheapest trial 1 at 0.62x its MFLOPs, validation NE 0.8555 (+0.0002; "
            "lower on 1 of 4 seeds, single-test p=0.64), test NE +0.0003") in text  # fmt: skip

    # 0.7% worse on the mean, yet 4 seeds cannot tell it apart: not at the baseline's NE
    loose = NEAR | {"1": [0.8600, 0.8700, 0.8500, 0.8650]}
    study = _costed(recorded_study(url.replace("studies", "loose"), TRIALS, BASE_AT_08, loose))
    assert paired_seeds(study, "1", "baseline:dlrm")["p_value"] >= SIGNIFICANCE
    assert verdict(study)["cheapest_within_noise"]["trial"] is None

    # trial 2 lower than the baseline on its seeds: the cheapest, though beyond noise better
    better = NEAR | {"2": [0.8540, 0.8550, 0.8530, 0.8550]}
    study = _costed(recorded_study(url.replace("studies", "better"), TRIALS, BASE_AT_08, better))
    assert verdict(study)["cheapest_within_noise"]["trial"] == 2

    # nothing cheaper holds the baseline's NE
    worse = {"0": NEAR["0"], "2": NEAR["2"], "baseline:dlrm": NEAR["baseline:dlrm"]}
    study = _costed(recorded_study(url.replace("studies", "worse"), TRIALS, BASE_AT_08, worse))
    assert verdict(study)["cheapest_within_noise"] == {"trial": None, "cheaper": 1}
    assert ("at baseline dlrm's NE: none of the 1 re-evaluated trials cheaper than it (its "
            "MFLOPs) has a lower seed mean, or one at most 0.1% higher within seed noise"
            ) in format_verdict(verdict(study))  # fmt: skip

    # a baseline without a recorded cost: no trial is cheaper than it, none named
    study = _costed(recorded_study(url.replace("studies", "costless"), TRIALS,
                                   {"dlrm": (0.855, None)}, NEAR))  # fmt: skip
    assert verdict(study)["cheapest_within_noise"] is None

    # every re-evaluated trial costs more than the baseline
    study = _costed(recorded_study(url.replace("studies", "cheap"), TRIALS, {"dlrm": (0.855, 0.2)},
                                   NEAR))  # fmt: skip
    assert verdict(study)["cheapest_within_noise"] == {"trial": None, "cheaper": 0}
    assert ("at baseline dlrm's NE: no re-evaluated trial is cheaper than it (its MFLOPs)"
            in format_verdict(verdict(study)))  # fmt: skip


def test_before_reevaluate_the_verdict_names_no_cheapest(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    v = verdict(recorded_study(url, TRIALS, baselines=BASE_AT_08))
    assert v["cheapest_within_noise"] is None and "cheapest" not in format_verdict(v)


def test_the_cheap_front_is_the_front_below_the_baselines_cost_and_near_its_ne(tmp_path):
    from nas.leaderboard import FRONT_SLACK, front_below_baseline

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    far = 0.855 * (1 + FRONT_SLACK) + 0.001  # on the front, too far from the baseline's NE
    study = recorded_study(url, [*TRIALS, (far, 0.1)], baselines=BASE_AT_08)
    assert [r["trial"] for r in pareto_front(study)] == [3, 2, 1, 0]
    near, far = front_below_baseline(study)
    assert [r["trial"] for r in near] == [2, 1] and [r["trial"] for r in far] == [3]
    assert front_below_baseline(recorded_study(url.replace("studies", "none"), TRIALS)) == ([], [])


def test_a_trial_number_out_of_range_is_told_the_complete_ones(tmp_path):
    """It said "a trial number below 8" of a study whose trials 5-7 were queued points."""
    from nas.leaderboard import best_trial
    from search_space.errors import RanknasError

    study = recorded_study(f"sqlite:///{tmp_path / 's.db'}", [(0.9, 1.0), (0.8, 1.0)])
    study.enqueue_trial({"x": 0.5})  # waiting: never exportable
    with pytest.raises(RanknasError, match=r"a complete trial's number \(0, 1: `ranknas leader"):
        best_trial(study, "7")


def test_a_best_trial_whose_seed_went_nan_loses_to_the_baseline(tmp_path):
    """Its seed mean is inf: the verdict said "the baseline leads on too few seeds to test"
    (the paired test has no finite differences), as though more seeds could change it."""
    import math

    from nas.leaderboard import format_verdict, verdict

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    runs = {"0": [0.850, math.inf, 0.851], "baseline:dlrm": [0.855, 0.856, 0.854]}
    study = recorded_study(url, TRIALS[:1], baselines={"dlrm": (0.855, 0.5)}, reevaluation=runs)
    v = verdict(study)
    assert v["outcome"] == "baseline_wins"
    said = format_verdict(v).splitlines()[0]
    assert "the baseline wins (a seed of trial 0 went nan or inf: its mean is inf)" in said, said
    # reevaluate's last lines: the command that exports the baseline, which wins
    from nas.commands import export_hint

    hint = export_hint(study, url).splitlines()
    assert hint[-1] == (f"the verdict: baseline dlrm wins; to ship it: ranknas export "
                        f"{study.study_name} --storage {url} --trial baseline:dlrm --out "
                        "winner-baseline-dlrm/")  # fmt: skip
    spaced = "sqlite:///my studies/s.db"  # a path a shell splits: quoted, to paste as it is
    assert export_hint(study, spaced).splitlines()[-1].startswith(
        f"the verdict: baseline dlrm wins; to ship it: ranknas export {study.study_name} "
        "--storage 'sqlite:///my studies/s.db' --trial")  # fmt: skip
    plain = recorded_study(url.replace("studies", "plain"), TRIALS)  # no baselines
    assert export_hint(plain, url).splitlines()[0].startswith("export it: ranknas export")
    assert len(export_hint(plain, url).splitlines()) == 1  # the best trial's command alone


def test_a_trial_whose_every_seed_diverged_is_no_best(tmp_path, capsys):
    """Its recorded run was below 1, its seeds all above: it was the study's best, exported
    without --force, while a baseline whose mean was above 1 was left out as diverged."""
    from nas.leaderboard import EVERY_FINALIST_DIVERGED

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    runs = {"0": [1.03, 1.06], "baseline:dlrm": [0.855, 0.856]}
    study = recorded_study(url, TRIALS[:2], baselines={"dlrm": (0.855, 0.5)}, reevaluation=runs)
    assert study_best(study) is None
    assert verdict(study)["outcome"] == "baseline_wins"
    assert "trial 0" in format_verdict(verdict(study)).splitlines()[0]
    with pytest.raises(RanknasError, match=re.escape(EVERY_FINALIST_DIVERGED)):
        best_trial(study)
    assert main(["status", study.study_name, "--storage", url]) == 0
    assert f"best: none: {EVERY_FINALIST_DIVERGED}" in capsys.readouterr().out
    from nas.commands import best_fields  # the MLflow parent run's: over an earlier best

    metrics, tags = best_fields(study)
    assert tags["best_trial"] == "none" and str(metrics["best_val_ne"]) == "nan"
    # by number it exports (its recorded run is complete), as README says
    assert main(["export", study.study_name, "--storage", url, "--trial", "0",
                 "--out", str(tmp_path / "w")]) == 2  # fmt: skip
    assert "weights not found" in capsys.readouterr().err  # a recorded study has no files
    # a sound finalist beside it is the best, whatever the diverged one's recorded run
    runs["1"] = [0.857, 0.858]
    other = recorded_study(url.replace("studies", "other"), TRIALS[:2],
                           baselines={"dlrm": (0.855, 0.5)}, reevaluation=runs)  # fmt: skip
    assert study_best(other)["trial"] == 1


def test_a_best_that_is_another_baseline_s_architecture_is_no_win(tmp_path):
    """The best trial's architecture added as a baseline (not compared: no seed means yet)
    left every surface saying "the search wins" with the user's own model."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    runs = {"0": [0.850, 0.851, 0.849], "baseline:dlrm": [0.860, 0.862, 0.861]}
    study = recorded_study(url, TRIALS[:1], baselines={"dlrm": (0.86, 0.5), "mine": (0.9, 1.0)},
                           reevaluation=runs)  # fmt: skip
    assert verdict(study)["outcome"] == "search_wins"
    study.set_user_attr("baselines:mine", study.user_attrs["baselines:mine"] | {
        "digest": "digest0"})  # trial 0's: the best's own architecture  # fmt: skip
    v = verdict(study)
    assert v["outcome"] == "no_win" and v["same_as"] == "mine" and not v["search_lower"]
    assert "no win: the search's best is baseline mine's own architecture" in format_verdict(v)


def test_a_cheaper_trial_within_seed_noise_and_a_better_baseline_left_out_are_said(tmp_path):
    """A new user's verdict read "undecided: within seed noise" and "baselines Pareto-dominated
    ...: prod_model" in one breath; and a baseline added after `reevaluate`, whose one run was
    below every compared model, went unmentioned (only "not compared: dcnv2")."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"0": [0.850, 0.862, 0.846], "baseline:prod": [0.853, 0.855, 0.857]}  # p ~ 0.8
    study = recorded_study(url, TRIALS, baselines={"prod": (0.855, 2.0), "dcnv2": (0.840, 1.5)},
                           reevaluation=means)  # fmt: skip
    v = verdict(study)
    assert v["outcome"] == "undecided" and v["dominated_baselines"] == ["prod"]
    assert v["dominated_within_noise"] == ["prod"] and v["not_compared_lower"] == {"dcnv2": 0.84}
    text = format_verdict(v)
    assert "seed means: prod (its NE lower, not beyond seed noise)" in text
    assert "not compared: dcnv2 (`ranknas reevaluate` retrains them with the same seeds); " \
           "of those, one run below both sides' NE: dcnv2 0.8400" in text  # fmt: skip
    # lower on every seed, beyond the noise: dominated, said plainly
    means["0"] = [0.845, 0.846, 0.847]
    study.set_user_attr("reevaluation", {k: {str(10_000 + i): [ne, ne + 0.001]
                                             for i, ne in enumerate(runs)}
                                         for k, runs in means.items()})  # fmt: skip
    v = verdict(study)
    assert v["dominated_within_noise"] == [] and "seed means: prod; baselines" in format_verdict(v)


def test_the_verdict_s_p_value_counts_the_finalists_and_the_looks(tmp_path):
    """The verdict tested the best of several finalists against the baseline on the very
    seeds it was chosen by, and again after each `reevaluate --seeds` round: a user's study
    went p=0.33, 0.096, 0.031 (a win) over three rounds. Bonferroni: p times both."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    # trial 0 lower than the baseline on every seed, by 0.001-0.004
    means = {"0": [0.852, 0.853, 0.853, 0.852], "baseline:dlrm": [0.855, 0.856, 0.854, 0.856]}
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=means)
    single = paired_seeds(study, "0", "baseline:dlrm")["p_value"]
    assert SIGNIFICANCE / 3 < single < SIGNIFICANCE
    v = verdict(study)  # one finalist, one look (a study recorded before looks were counted)
    assert v["paired"]["p_value"] == single and v["outcome"] == "search_wins"
    assert f"paired t-test p={single:.2g}): beyond seed noise" in format_verdict(v)
    # trial 0 is now the best of three finalists on these seeds
    means |= {"1": [0.854, 0.855, 0.856, 0.855], "2": [0.856, 0.857, 0.855, 0.858]}
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=means,
                           name="three")  # fmt: skip
    v = verdict(study)
    assert v["paired"]["p_value"] == pytest.approx(3 * single) and v["outcome"] == "undecided"
    said = (
        f"paired t-test p={single:.2g}; times 3, chosen among 3 re-evaluated trials by "
        f"seed mean (Bonferroni, at most 1): p={3 * single:.2g}): within seed noise"
    )
    assert said in format_verdict(v)
    # and looked at after each of two rounds: times 6, no more than 1
    study.set_user_attr("reevaluation_looks", {"count": 2, "tested": ["0", "dlrm", 4]})
    v = verdict(study)
    assert v["paired"]["p_value"] == pytest.approx(min(1.0, 6 * single))
    assert ("times 6, chosen among 3 re-evaluated trials by seed mean and tested after 2 "
            "rounds of seeds") in format_verdict(v)  # fmt: skip
    assert v["paired"]["p_single"] == single  # `leaderboard --json` keeps the single test's
    # the baseline lower, chosen among three baselines with seed means
    means = {"0": means["baseline:dlrm"], "baseline:dlrm": means["0"],
             "baseline:dcnv2": [0.859, 0.858, 0.857, 0.859],
             "baseline:deepfm": [0.861, 0.860, 0.862, 0.860]}  # fmt: skip
    bases = {"dlrm": (0.855, 0.5), "dcnv2": (0.858, 0.5), "deepfm": (0.86, 0.5)}
    study = recorded_study(url, TRIALS, baselines=bases, reevaluation=means, name="bases")
    v = verdict(study)
    assert v["paired"]["p_value"] == pytest.approx(3 * single) and v["outcome"] == "undecided"
    assert "times 3, chosen among 3 baselines by seed mean" in format_verdict(v)


def test_a_look_is_a_round_that_changed_the_verdict_s_paired_test(tmp_path):
    """A round whose seeds the verdict's test did not use (a trial's fifth seed beside the
    baseline's four; one seed each, no test at all) counted as a look: a helper's verdict
    went from "the baseline wins" to "undecided" on the very same test."""
    from nas.leaderboard import looks
    from nas.reevaluate import _count_look

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    runs = {"0": [0.852, 0.853, 0.853, 0.852], "baseline:dlrm": [0.855, 0.856, 0.854, 0.856]}

    def publish(study, means):  # what a round of `reevaluate` publishes, then counts
        looked = looks(study)
        study.set_user_attr("reevaluation", {k: {str(10_000 + i): [ne, ne + 0.001]
                                                 for i, ne in enumerate(seeds)}
                                             for k, seeds in means.items()})  # fmt: skip
        _count_look(study, verdict(study) or {}, looked)
        return looks(study)

    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)})
    assert publish(study, {k: v[:1] for k, v in runs.items()}) == 0  # one seed: no test
    assert publish(study, runs) == 1
    assert publish(study, runs | {"0": [*runs["0"], 0.851]}) == 1  # a seed the test cannot pair
    assert publish(study, {k: [*v, 0.851] for k, v in runs.items()}) == 2  # five seeds: a look
    # a study re-evaluated before looks were counted: that was one
    old = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=runs,
                         name="old")  # fmt: skip
    assert looks(old) == 1
    assert publish(old, {k: [*v, 0.851] for k, v in runs.items()}) == 2


def test_a_p_value_corrected_past_1_or_of_0_reads_true():
    """Capped, it read "p=1 = 0.62 times 6"; a p of 0 read "p=0 = 0 times 3"."""
    from nas.leaderboard import _paired_words, corrected

    paired = {"seeds": 5, "found_better": 2, "delta_val_ne_mean": 0.0006,
              "delta_val_ne_sd": 0.0025, "p_value": 0.62}  # fmt: skip
    v = {"best_trial": {"trial": 15}, "paired": corrected(paired, 6, "baselines", 1)}
    assert v["paired"]["p_value"] == 1.0
    assert ("paired t-test p=0.62; times 6, chosen among 6 baselines by seed mean "
            "(Bonferroni, at most 1): p=1): within seed noise") in _paired_words(v)  # fmt: skip
    v["paired"] = corrected(paired | {"p_value": 0.0}, 3, "baselines", 1)
    assert "paired t-test p=0): beyond seed noise" in _paired_words(v)


def test_a_dominated_baseline_is_beyond_noise_only_after_the_correction(tmp_path):
    """A baseline dominated by the best of several finalists was "beyond seed noise" on
    that one trial's single test."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"0": [0.852, 0.853, 0.853, 0.852], "baseline:dlrm": [0.855, 0.856, 0.854, 0.856]}
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 2.0)}, reevaluation=means)
    v = verdict(study)  # one finalist: its single test, beyond the noise
    assert v["dominated_baselines"] == ["dlrm"] and v["dominated_within_noise"] == []
    means |= {"1": [0.854, 0.855, 0.856, 0.855], "2": [0.856, 0.857, 0.855, 0.858]}
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 2.0)}, reevaluation=means,
                           name="three")  # fmt: skip
    v = verdict(study)
    assert "dlrm" in v["dominated_baselines"] and v["dominated_within_noise"] == ["dlrm"]


def test_status_names_the_base_searched_around_by_its_baseline_key(tmp_path, capsys):
    """It said "prod_model.json" (the file the study keeps) where every other line said
    "prod_model"."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, baselines={"prod_model": (0.855, 2.0)})
    study.set_user_attr("around_base", str(tmp_path / "models" / "prod_model.json"))
    assert main(["status", "recorded", "--storage", url]) == 0
    assert "searched around the best baseline: prod_model\n" in capsys.readouterr().out


def test_the_mlflow_view_ranks_trials_and_baselines_in_the_leaderboard_s_order(tmp_path):
    """Sorted by seed mean alone, the view put a tie's lowest mean first where every other
    surface names the cheaper trial, and the best trials not yet re-evaluated last."""
    from nas.leaderboard import view_ranks

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    trials = [*TRIALS, (0.849, 2.0)]  # trial 3: the lowest single run, not re-evaluated
    study = recorded_study(url, trials, baselines={"dlrm": (0.855, 0.5), "dcnv2": (0.851, 1.0)},
                           reevaluation=TIED)  # fmt: skip
    # trials 0 and 1 tie; the cheaper, 1, is the best although 0's mean is lower
    assert study_best(study)["trial"] == 1
    ranks = view_ranks(study)
    ordered = sorted(ranks, key=ranks.__getitem__)
    assert ordered == ["trial:1", "trial:0", "baseline:dlrm",  # seed means
                       "trial:3", "baseline:dcnv2", "trial:2"]  # fmt: skip  # single runs
    # before reevaluate, baselines chosen by seed means (best_baseline.seeds) stood ahead of
    # every trial, the study's best too
    study = recorded_study(f"sqlite:///{tmp_path / 'before.db'}", TRIALS,
                           baselines={"dlrm": (0.855, 0.5), "dcnv2": (0.851, 1.0)},
                           reevaluation={"baseline:dlrm": [0.853, 0.857, 0.855],
                                         "baseline:dcnv2": [0.851, 0.853, 0.852]})  # fmt: skip
    ranks = view_ranks(study)
    assert sorted(ranks, key=ranks.__getitem__) == [
        "trial:0", "baseline:dcnv2", "baseline:dlrm", "trial:1", "trial:2"]  # fmt: skip


def test_a_baseline_dominated_only_by_single_runs_is_said_apart(tmp_path):
    """After `reevaluate` the verdict said "Pareto-dominated ...: none" while the Pareto plot
    drew a trial not yet retrained below and left of the baseline."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"0": [0.850, 0.851, 0.849], "baseline:base": [0.855, 0.856, 0.854]}
    study = recorded_study(url, [(0.850, 1.0), (0.852, 0.3)], baselines={"base": (0.855, 0.5)},
                           reevaluation=means)  # fmt: skip
    v = verdict(study)
    assert v["dominated_baselines"] == [] and v["dominated_by_single_runs"] == {"base": [1]}
    assert ("seed means: none; by single runs not yet retrained (the plot draws them): base by "
            "trial 1; baselines") in format_verdict(v)  # fmt: skip


def test_a_study_whose_every_baseline_failed_says_why_it_has_no_verdict(tmp_path, capsys):
    """The README promised "failed or diverged, not compared: dlrm"; with every baseline
    failed the leaderboard printed no verdict line at all."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = recorded_study(url, TRIALS, baselines={"dlrm": (1.02, 0.5)})
    study.set_user_attr("baselines:dlrm", study.user_attrs["baselines:dlrm"] | {
        "status": "failed", "failure_reason": "diverged: validation NE 1.0200 >= 1.0"})  # fmt: skip
    assert main(["leaderboard", "recorded", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "no verdict: every baseline failed or diverged, not compared: dlrm (the failure" in out


def test_the_best_names_its_own_seed_count(tmp_path):
    """After `reevaluate --seeds 3` then `--seeds 4` of the best alone, the best line said
    "seed means over 3 fresh seeds" (the fewest of any finalist) of a mean over 4."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"0": [0.850, 0.851, 0.849, 0.850], "1": [0.856, 0.857, 0.855]}
    best = study_best(recorded_study(url, TRIALS, reevaluation=means))
    assert best["trial"] == 0
    assert best["basis"] == "seed means over 4 fresh seeds (the finalists' 3 to 4)"


def test_a_verdict_compares_a_trial_and_a_baseline_over_the_seeds_both_have(tmp_path):
    """`reevaluate --seeds 2` on a study whose best baseline was chosen by 3 seeds: the
    verdict set the trial's 2-seed mean against the baseline's 3-seed mean, labelled "over 3
    fresh seeds", beside a paired test over 2."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    runs = {"0": [0.9410, 0.9394], "baseline:dcnv2": [0.9430, 0.9436, 0.9451]}
    study = recorded_study(url, TRIALS[:1], baselines={"dcnv2": (0.9461, 0.5)}, reevaluation=runs)
    v = verdict(study)
    assert v["basis"] == "seed means over the 2 seeds both were trained with"
    assert v["best_baseline"]["val_ne"] == pytest.approx(0.9433)  # not 0.9439, over 3
    assert v["delta_val_ne"] == pytest.approx(v["paired"]["delta_val_ne_mean"])
    assert v["paired"]["seeds"] == 2
    # the same seeds: the means as recorded, said as before
    same = recorded_study(f"sqlite:///{tmp_path / 'same.db'}", TRIALS[:1],
                          baselines={"dcnv2": (0.9461, 0.5)},
                          reevaluation=runs | {"baseline:dcnv2": [0.9430, 0.9436]})  # fmt: skip
    assert verdict(same)["basis"] == "seed means over 2 fresh seeds"
    # a seed whose run failed (None) is in neither side's mean
    failed = recorded_study(f"sqlite:///{tmp_path / 'failed.db'}", TRIALS[:1],
                            baselines={"dcnv2": (0.9461, 0.5)},
                            reevaluation=runs | {"0": [0.9410, 0.0, 0.9400]})  # fmt: skip
    record = failed.user_attrs["reevaluation"]
    record["0"]["10001"] = [None, None]
    failed.set_user_attr("reevaluation", record)
    v = verdict(failed)
    assert v["basis"] == "seed means over the 2 seeds both were trained with"
    assert v["best_baseline"]["val_ne"] == pytest.approx((0.9430 + 0.9451) / 2)


def _runs(means: dict[str, list[float]], first_seed: int) -> dict[str, dict[str, list[float]]]:
    """A record of runs (`reevaluation` or `confirmation`): one validation NE per seed."""
    return {key: {str(first_seed + i): [ne, ne + 0.001] for i, ne in enumerate(seeds)}
            for key, seeds in means.items()}  # fmt: skip


def test_a_confirmation_tests_the_verdict_s_pair_on_seeds_that_chose_nothing(tmp_path, capsys):
    """Chosen among three finalists on the seeds it was tested on, the verdict's p was
    multiplied by 3; the pair retrained on seeds that chose neither side is tested alone,
    corrected only for the confirmation's own rounds."""
    from nas.reevaluate import CONFIRM_SEED, _count_confirmation_look

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"0": [0.852, 0.853, 0.853, 0.852], "baseline:dlrm": [0.855, 0.856, 0.854, 0.856],
             "1": [0.854, 0.855, 0.856, 0.855], "2": [0.856, 0.857, 0.855, 0.858]}  # fmt: skip
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=means)
    single = paired_seeds(study, "0", "baseline:dlrm")["p_value"]
    before = verdict(study)
    assert before["outcome"] == "undecided" and before["paired"]["comparisons"] == 3
    assert "`ranknas confirm CONFIG` tests this pair" in format_verdict(before)

    def confirm(record):  # what `ranknas confirm` publishes, then counts
        study.set_user_attr("confirmation", _runs(record, CONFIRM_SEED))
        _count_confirmation_look(study, verdict(study))
        return verdict(study)

    v = confirm({"0": means["0"], "baseline:dlrm": means["baseline:dlrm"]})
    assert v["confirmed"] and v["paired"]["p_value"] == pytest.approx(single)
    assert v["paired"]["comparisons"] == 1 and v["outcome"] == "search_wins"
    assert v["selection_paired"]["comparisons"] == 3  # the choosing seeds' test, kept
    assert v["best_trial"]["val_ne"] == pytest.approx(statistics.fmean(means["0"]))
    text = format_verdict(v)
    said = ("verdict (confirmation: seed means over the 4 seeds that chose nothing; the pair "
            "chosen on seed means over 4 fresh seeds)")  # fmt: skip
    assert text.startswith(said)
    assert "on 4 of 4 confirmation seeds" in text and "ranknas confirm CONFIG" not in text
    # the selection's own looks are its own: a confirmation round is not one of them
    assert study.user_attrs.get("reevaluation_looks") is None
    # a second round with more seeds is a second look at the confirmation
    more = {k: [*v, v[0]] for k, v in {"0": means["0"], "baseline:dlrm": means["baseline:dlrm"]}
            .items()}  # fmt: skip
    v = confirm(more)
    assert v["paired"]["looks"] == 2 and v["paired"]["comparisons"] == 2
    assert "times 2, for the 2 confirmation tests shown so far (Bonferroni" in format_verdict(v)
    assert v["confirmation_runs"]["0"][str(CONFIRM_SEED + 4)] == [0.852, pytest.approx(0.853)]
    # on the confirmation seeds the baseline is lower: that is the verdict, whatever the
    # choosing seeds said
    v = confirm({"0": more["baseline:dlrm"], "baseline:dlrm": more["0"]})
    assert not v["search_lower"] and v["outcome"] == "baseline_wins"
    # a confirmation seed that went nan/inf is the trial's outcome (its mean inf): it fell
    # back to the choosing seeds' test, which said the search wins, "no test yet"
    v = confirm({"0": [*means["0"][:3], math.inf], "baseline:dlrm": means["baseline:dlrm"]})
    assert v["confirmed"] and v["outcome"] == "baseline_wins"
    assert "went nan or inf" in format_verdict(v)
    # an interrupted confirmation: `status` sent its runs to `ranknas reevaluate`
    study.set_user_attr("confirmation_pending", {"0": {str(CONFIRM_SEED + 9): [0.85, 0.85]}})
    assert main(["status", "recorded", "--storage", url]) == 0
    said = capsys.readouterr().out
    assert "1 run of a confirmation that has not finished (`ranknas confirm`)" in said
    assert "re-evaluation that has not finished" not in said


def test_a_confirmed_test_is_a_look_once_whichever_round_shows_it(tmp_path):
    """A selection round that paired one confirmation's trial with another's baseline
    showed a test no round counted; a pair confirmed, left and chosen again showed the one
    already counted."""
    from nas.reevaluate import CONFIRM_SEED, _count_confirmation_look

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"0": [0.852, 0.853, 0.853, 0.852], "1": [0.854, 0.855, 0.856, 0.855],
             "baseline:dlrm": [0.855, 0.856, 0.854, 0.856],
             "baseline:dcnv2": [0.857, 0.858, 0.856, 0.858]}  # fmt: skip
    bases = {"dlrm": (0.855, 0.5), "dcnv2": (0.857, 0.5)}
    study = recorded_study(url, TRIALS, baselines=bases, reevaluation=means)
    # confirmed earlier: trial 0 against dcnv2, and trial 1 against dlrm
    study.set_user_attr("confirmation", _runs({"0": means["0"], "baseline:dcnv2": means["0"],
                                               "1": means["1"], "baseline:dlrm": means["1"]},
                                              CONFIRM_SEED))  # fmt: skip
    shown = [["0", "dcnv2", 4], ["1", "dlrm", 4]]
    study.set_user_attr("confirmation_looks", {"count": 2, "tested": shown[1], "shown": shown})
    v = verdict(study)  # the seed means choose trial 0 and dlrm: a pair never tested
    assert v["confirmed"] and [v["best_trial"]["trial"], v["best_baseline"]["baseline"]] == [
        0, "dlrm"]  # fmt: skip
    _count_confirmation_look(study, verdict(study))  # as after any round, a selection round too
    assert verdict(study)["paired"]["looks"] == 3
    _count_confirmation_look(study, verdict(study))  # the same test again: no more
    assert verdict(study)["paired"]["looks"] == 3


def test_another_pair_s_confirmation_is_not_the_verdict_s_test(tmp_path):
    """Confirmation runs of a pair the seed means no longer choose (a later `reevaluate`
    moved the best) are said, not used."""
    from nas.reevaluate import CONFIRM_SEED

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    means = {"0": [0.852, 0.853, 0.853, 0.852], "1": [0.854, 0.855, 0.856, 0.855],
             "baseline:dlrm": [0.855, 0.856, 0.854, 0.856]}  # fmt: skip
    study = recorded_study(url, TRIALS, baselines={"dlrm": (0.855, 0.5)}, reevaluation=means)
    study.set_user_attr("confirmation", _runs({"1": means["1"], "baseline:dlrm": means["0"]},
                                              CONFIRM_SEED))  # fmt: skip
    v = verdict(study)
    assert not v["confirmed"] and v["paired"]["comparisons"] == 2
    assert v["confirmation_unused"] == {"pair": ["1", "dlrm"]}  # from the runs recorded
    assert ("confirmation runs: of trial 1 and baseline dlrm, not the verdict's pair now"
            in format_verdict(v))  # fmt: skip
