"""The white-box audit can fail at the demo's (q, σ, T, m, guesses): on the tiny model (1 layer,
H = 16, V = 1024, every variable trained so the probe is the 16384-entry word embedding), with
the demo's q = 192/7000 (here B = 16 over n = 584 rows), σ = 0.7832, T = 50, δ = 1e-5, m = 2,000
canaries and the white-box guess grid, the noise-off positive control's f-DP bound is at least
1.2 × the claimed ε, and the honest run's bound does not exceed the claim (probability ≥ 1 − β
by the test's level: ``dpbert.privacy.fdp_audit``). Slow tier: one audited run of 50 steps plus
the f-DP bisections (≈ 2-4 min on 2 cores)."""
import pytest

from dpbert.config import load_config
from dpbert.evaluate import whitebox as wb
from tests.tiny import CLASSIC

ROWS, BATCH, STEPS, SIGMA, CANARIES = 584, 16, 50, 0.7832, 2000
DEMO_Q = 192 / 7000


@pytest.mark.slow
def test_noise_off_control_reaches_1_2_times_the_claim_and_the_honest_run_stays_below():
    from dpbert.privacy.plan import plan_for_config

    assert BATCH / ROWS == pytest.approx(DEMO_Q, rel=2e-3)
    cfg = load_config(None, CLASSIC + [
        "model.max_seq_length=16", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "model.dropout=0.0", f"training.batch_size={BATCH}", f"training.steps={STEPS}",
        f"training.dataset_size={ROWS}", "membership.holdout_patient_fraction=0", "training.trainable=[all]",
        f"training.noise_multiplier={SIGMA}", "training.clip_norm=1.0", "training.warmup_steps=0",
        "training.dp_diagnostics=false", "training.checkpoint_every=1000", "training.delta=1e-5"], preset="demo")
    ids, vocab = wb.demo_token_rows()
    res = wb.whitebox_audit(ids[:ROWS], list(wb.SPECIAL_IDS), vocab, cfg.model, cfg.training,
                            plan=plan_for_config(cfg, ROWS), mask_token_id=wb.MASK_ID,
                            settings=wb.AuditSettings(canaries=CANARIES, seed=5, public=True, positive_control=True))
    upper = res["epsilon_upper_bound"]
    print({k: res[k] for k in ("epsilon_lower_bound", "epsilon_upper_bound", "positive_control_lower_bound",
                               "positive_control_ratio", "sigma_upper_bound", "epsilon_lower_bound_snj",
                               "positive_control_lower_bound_snj", "weakest_detected_noise_factor",
                               "max_reachable_lower_bound", "probe_variable", "canary_dims", "seconds")})
    assert res["q"] == pytest.approx(BATCH / ROWS) and res["steps"] == STEPS and res["canary_dims"] == 16384
    assert 2.9 < upper < 3.0  # the demo's gradient ε at (σ, q, T, δ)
    assert res["positive_control_lower_bound"] >= 1.2 * upper, res
    assert res["epsilon_lower_bound"] <= upper and res["consistent"], res
    assert res["weakest_detected_noise_factor"] is not None and res["cannot_detect"]
