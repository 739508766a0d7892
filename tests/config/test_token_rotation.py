"""The GCS store token's rotation: ElastiCache's ROTATE and SET, with the head's restart between them, one
step per deploy (config/token_rotation.py)."""

from __future__ import annotations

import pytest

from config.token_rotation import RotationRefused, rotation_step


def step(target=2, deployed=1, rotated=None, synced=None, older=None):
    return rotation_step(
        target=target, deployed=deployed, rotated_version=rotated, mounts_synced=synced, older_clusters=older
    )


def test_a_new_generation_first_rotates_and_the_head_keeps_the_old_token():
    rotate = step()
    assert rotate.action == "rotate" and rotate.head_generation == 1
    assert "ElastiCache ROTATE: the old and the new token are both accepted" in rotate.says


@pytest.mark.parametrize(("synced", "why"), [(False, "not every mount holds it yet"), (None, "could not be asked")])
def test_the_head_waits_until_every_mount_holds_the_rotated_token(synced, why):
    wait = step(rotated="v-2", synced=synced)
    assert wait.action == "wait" and wait.head_generation == 1
    assert why in wait.says


def test_then_the_head_moves_to_the_new_generation():
    restart = step(rotated="v-2", synced=True)
    assert restart.action == "restart" and restart.head_generation == 2


@pytest.mark.parametrize(
    ("older", "who"), [(["pd-llm-abc12"], "pd-llm-abc12 still runs"), (None, "could not be asked")]
)
def test_the_old_token_stays_accepted_while_an_older_cluster_may_use_it(older, who):
    hold = step(deployed=2, rotated="v-2", older=older)
    assert hold.action == "hold" and hold.head_generation == 2
    assert who in hold.says


def test_set_once_no_older_cluster_is_left():
    assert step(deployed=2, rotated="v-2", older=[]).action == "set"
    assert step(deployed=2).action == "none"


def test_a_generation_skipped_or_taken_back_is_refused_in_one_line():
    with pytest.raises(RotationRefused) as skipped:
        step(target=4, deployed=2)
    assert str(skipped.value) == (
        "ray_service.gcs_fault_tolerance.store.auth_token_generation is 4 but the deployed head runs generation 2: "
        "the token rotates one generation at a time; set 3"
    )
    with pytest.raises(RotationRefused) as back:
        step(target=1, deployed=2)
    assert str(back.value).endswith("a token generation never goes back; keep 2")
