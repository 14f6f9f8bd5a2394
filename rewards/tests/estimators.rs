//! Every estimator against examples computed by hand in the comments.

use corvid_proto::{Termination, ToolStatus};
use corvid_rewards::*;

use Termination::{Abandoned, Answered, InfraError, MaxTurns};

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-9, "{a:?} vs {b:?}");
    }
}

fn some(a: &[Option<f64>]) -> Vec<f64> {
    a.iter().map(|x| x.expect("scored")).collect()
}

#[test]
fn discounted_returns_match_hand_computed() {
    // G2 = 2, G1 = 0 + .5*2 = 1, G0 = 1 + .5*1 = 1.5
    close(
        &discounted_returns(&[1.0, 0.0, 2.0], 0.5).unwrap(),
        &[1.5, 1.0, 2.0],
    );
    assert!(discounted_returns(&[], 0.9).unwrap().is_empty());
}

#[test]
fn returns_to_go_pay_the_outcome_at_the_last_turn() {
    // r = [0.1, 0, -0.05 + 1] ; G2 = .95, G1 = .9*.95 = .855, G0 = .1 + .9*.855 = .8695
    close(
        &returns_to_go(&[0.1, 0.0, -0.05], 1.0, 0.9).unwrap(),
        &[0.8695, 0.855, 0.95],
    );
}

#[test]
fn discount_outside_unit_interval_is_rejected() {
    assert!(matches!(
        discounted_returns(&[1.0], 1.5),
        Err(RewardsError::InvalidParameter { name: "gamma", .. })
    ));
    assert!(matches!(
        discounted_returns(&[f64::NAN], 0.5),
        Err(RewardsError::NotFinite { index: 0, .. })
    ));
}

#[test]
fn aggregation_sums_scales_and_clips_each_turn() {
    let comps = vec![vec![0.1, 0.2], vec![], vec![-3.0]];
    let agg = ProcessRewardAggregation::default();
    close(&agg.aggregate(&comps).unwrap(), &[0.3, 0.0, -1.0]);
    let half = ProcessRewardAggregation {
        weight: 0.5,
        clip: 1.0,
    };
    // .5*.3 = .15; 0; .5*-3 = -1.5 clipped to -1
    close(&half.aggregate(&comps).unwrap(), &[0.15, 0.0, -1.0]);
}

#[test]
fn episode_reward_adds_weighted_process_rewards() {
    assert!((episode_reward(1.0, &[0.1, -0.2, 0.3], 0.5) - 1.1).abs() < 1e-12);
}

#[test]
fn grpo_divides_by_unbiased_group_std() {
    // mean .5, var = 4*.25/3 = 1/3, std = .57735; A = ±.5/.57735 = ±.866025
    let a = trajectory_advantages(
        &[1.0, 0.0, 0.0, 1.0],
        &[Answered; 4],
        TrajectoryEstimator::Grpo { eps: 0.0 },
    )
    .unwrap();
    let s = 0.5 / (1.0f64 / 3.0).sqrt();
    close(&some(&a), &[s, -s, -s, s]);
}

#[test]
fn grpo_of_equal_rewards_is_zero_not_nan() {
    let a = trajectory_advantages(
        &[1.0; 3],
        &[Answered; 3],
        TrajectoryEstimator::Grpo { eps: 1e-6 },
    )
    .unwrap();
    close(&some(&a), &[0.0, 0.0, 0.0]);
}

#[test]
fn dr_grpo_subtracts_the_mean_only() {
    let a = trajectory_advantages(
        &[2.0, 1.0, 0.0],
        &[Answered; 3],
        TrajectoryEstimator::DrGrpo,
    )
    .unwrap();
    close(&some(&a), &[1.0, 0.0, -1.0]);
}

#[test]
fn rloo_uses_the_mean_of_the_others() {
    // A0 = 3 - (1+2)/2 = 1.5 ; A1 = 1 - (3+2)/2 = -1.5 ; A2 = 2 - (3+1)/2 = 0
    let a =
        trajectory_advantages(&[3.0, 1.0, 2.0], &[Answered; 3], TrajectoryEstimator::Rloo).unwrap();
    close(&some(&a), &[1.5, -1.5, 0.0]);
}

#[test]
fn infra_and_abandoned_episodes_are_excluded_never_scored_zero() {
    // Scored: [1, 0] -> mean .5. Had the crash counted as 0, the mean would be 1/3.
    let a = trajectory_advantages(
        &[1.0, 0.0, f64::NAN, 0.0],
        &[Answered, MaxTurns, InfraError, Abandoned],
        TrajectoryEstimator::DrGrpo,
    )
    .unwrap();
    assert_eq!(a[2], None);
    assert_eq!(a[3], None);
    close(&some(&a[..2]), &[0.5, -0.5]);
}

#[test]
fn a_single_scored_episode_gets_no_credit() {
    let a = trajectory_advantages(
        &[1.0, 0.0],
        &[Answered, InfraError],
        TrajectoryEstimator::Rloo,
    )
    .unwrap();
    assert_eq!(a, vec![Some(0.0), None]);
}

#[test]
fn parallel_slices_of_different_length_are_rejected() {
    assert!(matches!(
        trajectory_advantages(&[1.0, 0.0], &[Answered], TrajectoryEstimator::DrGrpo),
        Err(RewardsError::LengthMismatch { .. })
    ));
}

// Group used by the step-level tests (gamma = 1):
//   A: p = [0.1, 0.0],       R = 1 -> G_A = [1.1, 1.0]
//   B: p = [0.0, -0.1, 0.0], R = 0 -> G_B = [-0.1, -0.1, 0.0]
//   C: crashed (infra_error)       -> None
fn group<'a>(keys_a: &'a [u64], keys_b: &'a [u64]) -> Vec<StepEpisode<'a>> {
    vec![
        StepEpisode {
            process_rewards: &[0.1, 0.0],
            outcome: 1.0,
            termination: Answered,
            state_keys: keys_a,
        },
        StepEpisode {
            process_rewards: &[0.0, -0.1, 0.0],
            outcome: 0.0,
            termination: MaxTurns,
            state_keys: keys_b,
        },
        StepEpisode {
            process_rewards: &[5.0],
            outcome: 0.0,
            termination: InfraError,
            state_keys: &[9],
        },
    ]
}

#[test]
fn step_advantages_baseline_by_turn_index() {
    // t0: {1.1, -0.1} mean .5 -> .6, -.6 ; t1: {1.0, -0.1} mean .45 -> .55, -.55 ;
    // t2: only B -> 0
    let a = step_advantages(&group(&[], &[]), 1.0, StepBaseline::TurnIndex, false, 0.0).unwrap();
    close(a[0].as_ref().unwrap(), &[0.6, 0.55]);
    close(a[1].as_ref().unwrap(), &[-0.6, -0.55, 0.0]);
    assert_eq!(a[2], None);
}

#[test]
fn step_advantages_baseline_by_state_key() {
    // keys A = [1, 2], B = [1, 3, 2]
    // key 1: {1.1, -0.1} mean .5 -> .6, -.6 ; key 2: {A t1 = 1.0, B t2 = 0.0} mean .5
    // -> .5, -.5 ; key 3: only B t1 -> 0
    let a = step_advantages(
        &group(&[1, 2], &[1, 3, 2]),
        1.0,
        StepBaseline::StateKey,
        false,
        0.0,
    )
    .unwrap();
    close(a[0].as_ref().unwrap(), &[0.6, 0.5]);
    close(a[1].as_ref().unwrap(), &[-0.6, 0.0, -0.5]);
}

#[test]
fn step_advantages_normalise_by_bucket_std() {
    // t0 bucket {1.1, -0.1}: unbiased std = sqrt(2 * .36 / 1) = .848528 ; .6 / .848528 = .707107
    let a = step_advantages(&group(&[], &[]), 1.0, StepBaseline::TurnIndex, true, 0.0).unwrap();
    let s = 0.6 / (0.72f64).sqrt();
    assert!((a[0].as_ref().unwrap()[0] - s).abs() < 1e-9);
    assert!((a[1].as_ref().unwrap()[0] + s).abs() < 1e-9);
}

#[test]
fn step_advantages_discount_later_rewards() {
    // gamma .5: G_A = [.1 + .5*1, 1] = [.6, 1] ; G_B = [0 + .5*(-.1 + .5*0), -.1, 0] = [-.05, -.1, 0]
    // t0 mean .275 -> .325, -.325 ; t1 mean .45 -> .55, -.55
    let a = step_advantages(&group(&[], &[]), 0.5, StepBaseline::TurnIndex, false, 0.0).unwrap();
    close(a[0].as_ref().unwrap(), &[0.325, 0.55]);
    close(a[1].as_ref().unwrap(), &[-0.325, -0.55, 0.0]);
}

#[test]
fn state_keys_must_cover_every_turn() {
    assert!(matches!(
        step_advantages(
            &group(&[1], &[1, 2, 3]),
            1.0,
            StepBaseline::StateKey,
            false,
            0.0
        ),
        Err(RewardsError::LengthMismatch {
            what: "state_keys",
            ..
        })
    ));
}

#[test]
fn turn_advantage_reaches_every_generated_token() {
    close(
        &broadcast_to_tokens(&[0.5, -1.0], &[2, 3]).unwrap(),
        &[0.5, 0.5, -1.0, -1.0, -1.0],
    );
}

#[test]
fn pass_at_k_matches_binomial_formula() {
    // 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert!((pass_at_k(5, 2, 2).unwrap() - 0.7).abs() < 1e-12);
    assert!((pass_at_k(10, 3, 1).unwrap() - 0.3).abs() < 1e-12);
    assert_eq!(pass_at_k(5, 0, 3).unwrap(), 0.0);
    assert_eq!(pass_at_k(5, 4, 2).unwrap(), 1.0);
    assert!(pass_at_k(5, 6, 2).is_err());
    assert!(pass_at_k(5, 2, 6).is_err());
}

#[test]
fn pass_hat_k_requires_all_k_correct() {
    // C(3,2)/C(5,2) = 3/10
    assert!((pass_hat_k(5, 3, 2).unwrap() - 0.3).abs() < 1e-12);
    assert_eq!(pass_hat_k(5, 1, 2).unwrap(), 0.0);
    assert_eq!(pass_hat_k(4, 4, 4).unwrap(), 1.0);
    // mean over tasks: (0.3 + 1.0) / 2
    let m = mean_pass_hat_k(&[(5, 3), (4, 4)], 2).unwrap().unwrap();
    assert!((m - 0.65).abs() < 1e-12);
    assert_eq!(mean_pass_at_k(&[], 2).unwrap(), None);
}

#[test]
fn evaluator_metrics_match_hand_counts() {
    use ToolStatus as S;
    let eps = vec![
        EpisodeEval {
            call_attempts: 3,
            call_statuses: vec![S::Ok, S::NotFound, S::Ok],
            success: true,
            termination: Answered,
            oracle_calls: 2,
        },
        EpisodeEval {
            call_attempts: 2,
            call_statuses: vec![S::Ok],
            success: false,
            termination: MaxTurns,
            oracle_calls: 2,
        },
        EpisodeEval {
            call_attempts: 1,
            call_statuses: vec![S::InvalidCall],
            success: false,
            termination: Answered,
            oracle_calls: 1,
        },
        EpisodeEval {
            call_attempts: 5,
            call_statuses: vec![S::InfraError],
            success: false,
            termination: InfraError,
            oracle_calls: 2,
        },
    ];
    let m = EvalMetrics::from_episodes(&eps);
    // parsed 5 of 6 attempts; 3 of 5 judged calls ok; multi-step: 1 of {E1, E2};
    // failed-call episodes {E1 solved, E3 not}: 1/2; solved 1 of 3 scored.
    assert_eq!(m.tool_call_parse_rate, Some(5.0 / 6.0));
    assert_eq!(m.tool_call_success_rate, Some(0.6));
    assert_eq!(m.multi_step_completion, Some(0.5));
    assert_eq!(m.failure_recovery_rate, Some(0.5));
    assert_eq!(m.success_rate, Some(1.0 / 3.0));
    assert_eq!((m.scored, m.excluded), (3, 1));
}
