"""Names both sides of the extender-driver contract use: driver, device attributes, capacities,
labels and the Queue API. Changing one here changes it for the extender and the driver at once."""

from typing import Final

# The DRA driver's name: ResourceSlices' spec.driver, claim allocation results, CDI vendor.
DRIVER_NAME: Final = "gpu.tessera.dev"

# Device attributes the driver publishes and the extender reads (bare or qualified by the driver).
MODEL_ATTRIBUTE: Final = "productName"
DEVICE_TYPE_ATTRIBUTE: Final = "type"

# Consumable capacities of a shareable GPU device: bytes of memory, and compute in thousandths.
MEMORY_CAPACITY: Final = "memory"
COMPUTE_CAPACITY: Final = "compute"
# A partitionable GPU's counter of compute slices (KEP-4815 shared counters): the whole GPU
# consumes all of them (7 on A100/H100/H200), a MIG placement its own.
COMPUTE_SLICES_COUNTER: Final = "compute-slices"
MIG_COMPUTE_SLICES: Final = 7
# Thousandths of one GPU: placement's unit for fractions and the driver's "compute" of a whole GPU.
GPU_MILLI: Final = 1000

# GPUs advertised by NVIDIA's device plugin, and the node label naming their model.
CLASSIC_GPU_RESOURCE: Final = "nvidia.com/gpu"
CLASSIC_MODEL_LABEL: Final = "nvidia.com/gpu.product"

# The Queue custom resource and the pod label naming a pod's queue.
QUEUE_GROUP: Final = "scheduling.tessera.dev"
QUEUE_VERSION: Final = "v1alpha1"
QUEUE_PLURAL: Final = "queues"
QUEUE_KIND: Final = "Queue"
QUEUE_LABEL: Final = "scheduling.tessera.dev/queue"
DEFAULT_QUEUE: Final = "default"
# A pod label that says whether reclaim may evict the pod ("true"/"false"); without it, pods whose
# priority is below the extender's --non-preemptible-priority (default 100) are preemptible.
PREEMPTIBLE_LABEL: Final = "scheduling.tessera.dev/preemptible"
# A pod annotation that opts it out of consolidation ("false"): it is never moved to defragment GPUs.
MOVABLE_ANNOTATION: Final = "scheduling.tessera.dev/movable"
# Controllers that recreate a pod evicted from under them: only their pods may be moved. A
# DaemonSet recreates its pod on the same node, so moving one frees nothing.
RECREATING_OWNER_KINDS: Final = frozenset({"ReplicaSet", "StatefulSet", "Job", "ReplicationController"})
# A Namespace label naming the queue of its pods that name none themselves (nor their owners).
NAMESPACE_QUEUE_LABEL: Final = "scheduling.tessera.dev/default-queue"
# A Namespace label ("true") asking the admission webhook to send its pods to Tessera's own
# scheduler profile (when the chart runs one) unless they name another scheduler.
NAMESPACE_SCHEDULER_LABEL: Final = "scheduling.tessera.dev/use-scheduler"
# The scheduling gate the admission webhook puts on a pod that its queue holds back (a limit, an
# unknown or unusable queue); the extender removes it once the pod is admissible. While it is on,
# kube-scheduler does not try the pod, so autoscalers never see it as Unschedulable.
ADMISSION_GATE: Final = "scheduling.tessera.dev/admission"
# Workloads (gangs): a pod annotation setting its workload's minimum member count, and a pod label
# grouping pods that no controller groups (bare pods) into one workload of that name.
MIN_MEMBERS_ANNOTATION: Final = "scheduling.tessera.dev/min-members"
WORKLOAD_LABEL: Final = "scheduling.tessera.dev/workload"
# Topology-aware gangs: pod annotations naming the level (of the extender's --topology-levels) all
# of the workload's members must share one domain of, and the level they are packed by if they can.
TOPOLOGY_REQUIRED_ANNOTATION: Final = "scheduling.tessera.dev/topology-required"
TOPOLOGY_PREFERRED_ANNOTATION: Final = "scheduling.tessera.dev/topology-preferred"
# Subgroups: a pod label naming the part of its workload it belongs to (leader, workers, ...), and a
# pod annotation stating each part's minimum ("leader=1,workers=4"): the gang starts only with every
# part at its minimum, and members above their part's minimum are elastic.
SUBGROUP_LABEL: Final = "scheduling.tessera.dev/subgroup"
SUBGROUP_MINIMUMS_ANNOTATION: Final = "scheduling.tessera.dev/subgroup-min-members"
