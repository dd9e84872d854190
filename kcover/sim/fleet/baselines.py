"""The fleet replay's reference policies: Kubernetes alone, the Go controller's policy, and the oracle.

Owns three small `policy.Policy`s, each what its name says and nothing more, run on the same trace as
kcover. None is kcover's judgement re-implemented; kcover runs as itself (`kcoverpolicy`).

* `KubernetesAlone`: no controller. What Kubernetes does by itself (the kubelet restarting containers
  in place with its back-off, NotReady pods evicted after the default toleration) is the world's, so this
  policy does nothing: it sees no GPU signal.
* `GoController`: the Go kcover's policy: restart the job (delete its pods) on any container `Error`,
  unless it restarted that job less than `COOLDOWN_SECONDS` (30 s) ago, `REACTION_SECONDS` after the
  exit (an informer's delivery); cordon a node only when its DCGM diagnostic failed.
* `Oracle`: knows each fault's true cause at its first signal (the world hands it the fault behind
  every signal) and acts at once: a persistent hardware fault's node is cordoned (no finer isolation
  exists for whole-node pods) and its job restarted; any other fault's job is restarted; pods lost on a
  NotReady node are replaced at once (`force_deletes`); a healthy node is never touched. It is the limit
  a policy can reach with the restart cost and checkpoints the world imposes, not a policy one could run.
"""

from __future__ import annotations

from kcover.sim.fleet import state as st
from kcover.sim.fleet import taxonomy as tax
from kcover.sim.fleet import world as world_


class _Base:
    name = ""
    force_deletes = False

    async def attach(self, world: world_.World) -> None:
        self.world = world

    async def notify(self, notice: st.Notice, cause: st.Fault | None) -> None:
        return None

    async def advance(self, until: float) -> bool:
        return True

    async def close(self) -> None:
        return None


class KubernetesAlone(_Base):
    name = "kubernetes"


class GoController(_Base):
    name = "go"
    COOLDOWN_SECONDS = 30.0
    REACTION_SECONDS = 1.0

    def __init__(self) -> None:
        self.last_restart: dict[str, float] = {}

    async def notify(self, notice: st.Notice, cause: st.Fault | None) -> None:
        world = self.world
        if isinstance(notice, st.RankExited):
            at = world.now + self.REACTION_SECONDS
            last = self.last_restart.get(notice.job)
            if last is not None and at - last < self.COOLDOWN_SECONDS:
                return
            self.last_restart[notice.job] = at
            world.at(at, lambda: world.restart_job(notice.job))
        elif isinstance(notice, st.DiagResult) and notice.failed:
            world.at(world.now + self.REACTION_SECONDS,
                     lambda: world.cordon(notice.node, cause="DCGM diagnostic failed"))


class Oracle(_Base):
    name = "oracle"
    force_deletes = True

    async def notify(self, notice: st.Notice, cause: st.Fault | None) -> None:
        if cause is None or isinstance(notice, st.Placed | st.PersonCordoned | st.NodeReturned):
            return
        if isinstance(notice, st.NodeReadiness | st.DiagResult) and not (
                (isinstance(notice, st.NodeReadiness) and not notice.ready) or
                (isinstance(notice, st.DiagResult) and notice.failed)):
            return
        world = self.world
        node = world.nodes[cause.onset.node]
        if cause.persistent and cause.cls.blame.hardware and cause.active and not node.cordoned_by:
            await world.cordon(node.index, cause=f"{cause.cls.name} (oracle)")
        job_name = notice.job if isinstance(notice, st.RankExited) else node.job
        if cause.cls.physics is tax.Physics.FOLLOWS_JOB:
            job_name = cause.job
        job = world.jobs.get(job_name) if job_name else None
        if job is not None and job.state is st.JobState.DOWN:
            await world.restart_job(job.name)
