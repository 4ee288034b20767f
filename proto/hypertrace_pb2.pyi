import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Histogram(_message.Message):
    __slots__ = ("scheme", "first_bucket", "counts")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    FIRST_BUCKET_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    scheme: int
    first_bucket: int
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, scheme: _Optional[int] = ..., first_bucket: _Optional[int] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class ApiStats(_message.Message):
    __slots__ = ("api", "count", "sum_us", "min_us", "max_us", "histogram")
    API_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_US_FIELD_NUMBER: _ClassVar[int]
    MIN_US_FIELD_NUMBER: _ClassVar[int]
    MAX_US_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    api: str
    count: int
    sum_us: float
    min_us: float
    max_us: float
    histogram: Histogram
    def __init__(self, api: _Optional[str] = ..., count: _Optional[int] = ..., sum_us: _Optional[float] = ..., min_us: _Optional[float] = ..., max_us: _Optional[float] = ..., histogram: _Optional[_Union[Histogram, _Mapping]] = ...) -> None: ...

class NvmlContext(_message.Message):
    __slots__ = ("sm_clock_mhz", "max_sm_clock_mhz", "clock_event_reasons", "temperature_c", "power_w", "power_limit_w", "xid_errors", "pcie_replay_count", "pcie_link_width", "pcie_max_link_width")
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MAX_SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    XID_ERRORS_FIELD_NUMBER: _ClassVar[int]
    PCIE_REPLAY_COUNT_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PCIE_MAX_LINK_WIDTH_FIELD_NUMBER: _ClassVar[int]
    sm_clock_mhz: int
    max_sm_clock_mhz: int
    clock_event_reasons: int
    temperature_c: float
    power_w: float
    power_limit_w: float
    xid_errors: _containers.RepeatedScalarFieldContainer[int]
    pcie_replay_count: int
    pcie_link_width: int
    pcie_max_link_width: int
    def __init__(self, sm_clock_mhz: _Optional[int] = ..., max_sm_clock_mhz: _Optional[int] = ..., clock_event_reasons: _Optional[int] = ..., temperature_c: _Optional[float] = ..., power_w: _Optional[float] = ..., power_limit_w: _Optional[float] = ..., xid_errors: _Optional[_Iterable[int]] = ..., pcie_replay_count: _Optional[int] = ..., pcie_link_width: _Optional[int] = ..., pcie_max_link_width: _Optional[int] = ...) -> None: ...

class Overhead(_message.Message):
    __slots__ = ("estimated_fraction", "duty", "probe_cost_ns", "call_rate_hz", "budget", "sampled", "unsampled_reason", "tiers", "attached_s", "fixed_cost_s", "step_fraction", "step_basis", "blocked_by")
    ESTIMATED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    DUTY_FIELD_NUMBER: _ClassVar[int]
    PROBE_COST_NS_FIELD_NUMBER: _ClassVar[int]
    CALL_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    UNSAMPLED_REASON_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_S_FIELD_NUMBER: _ClassVar[int]
    FIXED_COST_S_FIELD_NUMBER: _ClassVar[int]
    STEP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    STEP_BASIS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    estimated_fraction: float
    duty: float
    probe_cost_ns: float
    call_rate_hz: float
    budget: float
    sampled: bool
    unsampled_reason: str
    tiers: _containers.RepeatedCompositeFieldContainer[ApiTier]
    attached_s: float
    fixed_cost_s: float
    step_fraction: float
    step_basis: str
    blocked_by: str
    def __init__(self, estimated_fraction: _Optional[float] = ..., duty: _Optional[float] = ..., probe_cost_ns: _Optional[float] = ..., call_rate_hz: _Optional[float] = ..., budget: _Optional[float] = ..., sampled: _Optional[bool] = ..., unsampled_reason: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[ApiTier, _Mapping]]] = ..., attached_s: _Optional[float] = ..., fixed_cost_s: _Optional[float] = ..., step_fraction: _Optional[float] = ..., step_basis: _Optional[str] = ..., blocked_by: _Optional[str] = ...) -> None: ...

class ApiTier(_message.Message):
    __slots__ = ("api", "tier", "rate_hz")
    API_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    api: str
    tier: str
    rate_hz: float
    def __init__(self, api: _Optional[str] = ..., tier: _Optional[str] = ..., rate_hz: _Optional[float] = ...) -> None: ...

class SchedStats(_message.Message):
    __slots__ = ("runq_ns", "offcpu_ns", "involuntary_switches", "voluntary_switches", "runq_latency", "window_s")
    RUNQ_NS_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_NS_FIELD_NUMBER: _ClassVar[int]
    INVOLUNTARY_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    VOLUNTARY_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    RUNQ_LATENCY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    runq_ns: int
    offcpu_ns: int
    involuntary_switches: int
    voluntary_switches: int
    runq_latency: Histogram
    window_s: float
    def __init__(self, runq_ns: _Optional[int] = ..., offcpu_ns: _Optional[int] = ..., involuntary_switches: _Optional[int] = ..., voluntary_switches: _Optional[int] = ..., runq_latency: _Optional[_Union[Histogram, _Mapping]] = ..., window_s: _Optional[float] = ...) -> None: ...

class StepStats(_message.Message):
    __slots__ = ("source", "refused", "steps", "busy_time", "gpu_wait_us", "peer_wait_us", "step_sum_us", "loader_wait_us", "own_time", "io_wait_us")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BUSY_TIME_FIELD_NUMBER: _ClassVar[int]
    GPU_WAIT_US_FIELD_NUMBER: _ClassVar[int]
    PEER_WAIT_US_FIELD_NUMBER: _ClassVar[int]
    STEP_SUM_US_FIELD_NUMBER: _ClassVar[int]
    LOADER_WAIT_US_FIELD_NUMBER: _ClassVar[int]
    OWN_TIME_FIELD_NUMBER: _ClassVar[int]
    IO_WAIT_US_FIELD_NUMBER: _ClassVar[int]
    source: str
    refused: str
    steps: int
    busy_time: Histogram
    gpu_wait_us: float
    peer_wait_us: float
    step_sum_us: float
    loader_wait_us: float
    own_time: Histogram
    io_wait_us: float
    def __init__(self, source: _Optional[str] = ..., refused: _Optional[str] = ..., steps: _Optional[int] = ..., busy_time: _Optional[_Union[Histogram, _Mapping]] = ..., gpu_wait_us: _Optional[float] = ..., peer_wait_us: _Optional[float] = ..., step_sum_us: _Optional[float] = ..., loader_wait_us: _Optional[float] = ..., own_time: _Optional[_Union[Histogram, _Mapping]] = ..., io_wait_us: _Optional[float] = ...) -> None: ...

class LoaderStats(_message.Message):
    __slots__ = ("workers", "cpu_s", "runq_s")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    RUNQ_S_FIELD_NUMBER: _ClassVar[int]
    workers: int
    cpu_s: float
    runq_s: float
    def __init__(self, workers: _Optional[int] = ..., cpu_s: _Optional[float] = ..., runq_s: _Optional[float] = ...) -> None: ...

class ProcessWindow(_message.Message):
    __slots__ = ("job_id", "rank", "local_rank", "gpu_index", "gpu_uuid", "pid", "gpu_kind", "apis", "step_time", "nvml", "overhead", "sched", "steps", "group", "backend", "loader")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    GPU_KIND_FIELD_NUMBER: _ClassVar[int]
    APIS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_FIELD_NUMBER: _ClassVar[int]
    NVML_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_FIELD_NUMBER: _ClassVar[int]
    SCHED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    LOADER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    local_rank: int
    gpu_index: int
    gpu_uuid: str
    pid: int
    gpu_kind: str
    apis: _containers.RepeatedCompositeFieldContainer[ApiStats]
    step_time: Histogram
    nvml: NvmlContext
    overhead: Overhead
    sched: SchedStats
    steps: StepStats
    group: str
    backend: str
    loader: LoaderStats
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., pid: _Optional[int] = ..., gpu_kind: _Optional[str] = ..., apis: _Optional[_Iterable[_Union[ApiStats, _Mapping]]] = ..., step_time: _Optional[_Union[Histogram, _Mapping]] = ..., nvml: _Optional[_Union[NvmlContext, _Mapping]] = ..., overhead: _Optional[_Union[Overhead, _Mapping]] = ..., sched: _Optional[_Union[SchedStats, _Mapping]] = ..., steps: _Optional[_Union[StepStats, _Mapping]] = ..., group: _Optional[str] = ..., backend: _Optional[str] = ..., loader: _Optional[_Union[LoaderStats, _Mapping]] = ...) -> None: ...

class NodeWindow(_message.Message):
    __slots__ = ("version", "agent_id", "node", "seq", "start", "end", "processes", "rejected_processes", "agent_version", "agent_backend", "probe_mode", "node_gpus")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_BACKEND_FIELD_NUMBER: _ClassVar[int]
    PROBE_MODE_FIELD_NUMBER: _ClassVar[int]
    NODE_GPUS_FIELD_NUMBER: _ClassVar[int]
    version: int
    agent_id: str
    node: str
    seq: int
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    processes: _containers.RepeatedCompositeFieldContainer[ProcessWindow]
    rejected_processes: int
    agent_version: str
    agent_backend: str
    probe_mode: str
    node_gpus: int
    def __init__(self, version: _Optional[int] = ..., agent_id: _Optional[str] = ..., node: _Optional[str] = ..., seq: _Optional[int] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., processes: _Optional[_Iterable[_Union[ProcessWindow, _Mapping]]] = ..., rejected_processes: _Optional[int] = ..., agent_version: _Optional[str] = ..., agent_backend: _Optional[str] = ..., probe_mode: _Optional[str] = ..., node_gpus: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("agent_id", "seq", "duplicate", "rejected_processes", "rejected_reason")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    REJECTED_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_REASON_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    seq: int
    duplicate: bool
    rejected_processes: int
    rejected_reason: str
    def __init__(self, agent_id: _Optional[str] = ..., seq: _Optional[int] = ..., duplicate: _Optional[bool] = ..., rejected_processes: _Optional[int] = ..., rejected_reason: _Optional[str] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("api", "stat", "value_us", "job_median_us", "ratio", "robust_z", "direction", "meaning", "basis", "unit", "step_share")
    API_FIELD_NUMBER: _ClassVar[int]
    STAT_FIELD_NUMBER: _ClassVar[int]
    VALUE_US_FIELD_NUMBER: _ClassVar[int]
    JOB_MEDIAN_US_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    ROBUST_Z_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    MEANING_FIELD_NUMBER: _ClassVar[int]
    BASIS_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    STEP_SHARE_FIELD_NUMBER: _ClassVar[int]
    api: str
    stat: str
    value_us: float
    job_median_us: float
    ratio: float
    robust_z: float
    direction: str
    meaning: str
    basis: str
    unit: str
    step_share: float
    def __init__(self, api: _Optional[str] = ..., stat: _Optional[str] = ..., value_us: _Optional[float] = ..., job_median_us: _Optional[float] = ..., ratio: _Optional[float] = ..., robust_z: _Optional[float] = ..., direction: _Optional[str] = ..., meaning: _Optional[str] = ..., basis: _Optional[str] = ..., unit: _Optional[str] = ..., step_share: _Optional[float] = ...) -> None: ...

class GpuReport(_message.Message):
    __slots__ = ("gpu", "rank", "verdict", "windows_flagged", "windows_seen", "spike_rate", "findings", "probable_cause", "gpu_kind", "p50_ratio", "nvml")
    class P50RatioEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    GPU_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FLAGGED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_SEEN_FIELD_NUMBER: _ClassVar[int]
    SPIKE_RATE_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    PROBABLE_CAUSE_FIELD_NUMBER: _ClassVar[int]
    GPU_KIND_FIELD_NUMBER: _ClassVar[int]
    P50_RATIO_FIELD_NUMBER: _ClassVar[int]
    NVML_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    rank: int
    verdict: str
    windows_flagged: int
    windows_seen: int
    spike_rate: float
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    probable_cause: str
    gpu_kind: str
    p50_ratio: _containers.ScalarMap[str, float]
    nvml: NvmlContext
    def __init__(self, gpu: _Optional[str] = ..., rank: _Optional[int] = ..., verdict: _Optional[str] = ..., windows_flagged: _Optional[int] = ..., windows_seen: _Optional[int] = ..., spike_rate: _Optional[float] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., probable_cause: _Optional[str] = ..., gpu_kind: _Optional[str] = ..., p50_ratio: _Optional[_Mapping[str, float]] = ..., nvml: _Optional[_Union[NvmlContext, _Mapping]] = ...) -> None: ...

class LatencyCdf(_message.Message):
    __slots__ = ("node", "api", "upper_us", "job", "node_cdf")
    NODE_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    UPPER_US_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODE_CDF_FIELD_NUMBER: _ClassVar[int]
    node: str
    api: str
    upper_us: _containers.RepeatedScalarFieldContainer[float]
    job: _containers.RepeatedScalarFieldContainer[float]
    node_cdf: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, node: _Optional[str] = ..., api: _Optional[str] = ..., upper_us: _Optional[_Iterable[float]] = ..., job: _Optional[_Iterable[float]] = ..., node_cdf: _Optional[_Iterable[float]] = ...) -> None: ...

class NodeReport(_message.Message):
    __slots__ = ("node", "verdict", "scope", "probable_cause", "gpus", "window_ratios", "series", "lemon_jobs")
    NODE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    PROBABLE_CAUSE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_RATIOS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    LEMON_JOBS_FIELD_NUMBER: _ClassVar[int]
    node: str
    verdict: str
    scope: str
    probable_cause: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuReport]
    window_ratios: _containers.RepeatedScalarFieldContainer[float]
    series: _containers.RepeatedCompositeFieldContainer[SignalSeries]
    lemon_jobs: int
    def __init__(self, node: _Optional[str] = ..., verdict: _Optional[str] = ..., scope: _Optional[str] = ..., probable_cause: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuReport, _Mapping]]] = ..., window_ratios: _Optional[_Iterable[float]] = ..., series: _Optional[_Iterable[_Union[SignalSeries, _Mapping]]] = ..., lemon_jobs: _Optional[int] = ...) -> None: ...

class SignalSeries(_message.Message):
    __slots__ = ("signal", "stat", "unit", "node", "job_median", "job_p10", "job_p90")
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STAT_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    JOB_MEDIAN_FIELD_NUMBER: _ClassVar[int]
    JOB_P10_FIELD_NUMBER: _ClassVar[int]
    JOB_P90_FIELD_NUMBER: _ClassVar[int]
    signal: str
    stat: str
    unit: str
    node: _containers.RepeatedScalarFieldContainer[float]
    job_median: _containers.RepeatedScalarFieldContainer[float]
    job_p10: _containers.RepeatedScalarFieldContainer[float]
    job_p90: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, signal: _Optional[str] = ..., stat: _Optional[str] = ..., unit: _Optional[str] = ..., node: _Optional[_Iterable[float]] = ..., job_median: _Optional[_Iterable[float]] = ..., job_p10: _Optional[_Iterable[float]] = ..., job_p90: _Optional[_Iterable[float]] = ...) -> None: ...

class WhatIfPoint(_message.Message):
    __slots__ = ("ranks", "now_us", "after_us")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    NOW_US_FIELD_NUMBER: _ClassVar[int]
    AFTER_US_FIELD_NUMBER: _ClassVar[int]
    ranks: int
    now_us: float
    after_us: float
    def __init__(self, ranks: _Optional[int] = ..., now_us: _Optional[float] = ..., after_us: _Optional[float] = ...) -> None: ...

class SpikeRates(_message.Message):
    __slots__ = ("upper", "gpus", "mean")
    UPPER_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    upper: _containers.RepeatedScalarFieldContainer[float]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    mean: float
    def __init__(self, upper: _Optional[_Iterable[float]] = ..., gpus: _Optional[_Iterable[int]] = ..., mean: _Optional[float] = ...) -> None: ...

class ClusterPrediction(_message.Message):
    __slots__ = ("spike_probability", "basis", "step_time_now_us", "step_time_after_eviction_us", "predicted_gain", "evicted_nodes", "spike_basis", "curve", "measured_step_us")
    SPIKE_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    BASIS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_NOW_US_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_AFTER_EVICTION_US_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_GAIN_FIELD_NUMBER: _ClassVar[int]
    EVICTED_NODES_FIELD_NUMBER: _ClassVar[int]
    SPIKE_BASIS_FIELD_NUMBER: _ClassVar[int]
    CURVE_FIELD_NUMBER: _ClassVar[int]
    MEASURED_STEP_US_FIELD_NUMBER: _ClassVar[int]
    spike_probability: float
    basis: str
    step_time_now_us: float
    step_time_after_eviction_us: float
    predicted_gain: float
    evicted_nodes: _containers.RepeatedScalarFieldContainer[str]
    spike_basis: str
    curve: _containers.RepeatedCompositeFieldContainer[WhatIfPoint]
    measured_step_us: float
    def __init__(self, spike_probability: _Optional[float] = ..., basis: _Optional[str] = ..., step_time_now_us: _Optional[float] = ..., step_time_after_eviction_us: _Optional[float] = ..., predicted_gain: _Optional[float] = ..., evicted_nodes: _Optional[_Iterable[str]] = ..., spike_basis: _Optional[str] = ..., curve: _Optional[_Iterable[_Union[WhatIfPoint, _Mapping]]] = ..., measured_step_us: _Optional[float] = ...) -> None: ...

class JobReport(_message.Message):
    __slots__ = ("job_id", "windows", "gpus", "nodes", "cluster", "windows_sampled", "mode", "imbalance", "late_windows", "late_nodes", "healthy_nodes_omitted", "history_windows", "latency_cdfs", "spike_rates", "held_nodes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    LATE_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    LATE_NODES_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_NODES_OMITTED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_CDFS_FIELD_NUMBER: _ClassVar[int]
    SPIKE_RATES_FIELD_NUMBER: _ClassVar[int]
    HELD_NODES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    windows: int
    gpus: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeReport]
    cluster: ClusterPrediction
    windows_sampled: int
    mode: str
    imbalance: _containers.RepeatedCompositeFieldContainer[GroupImbalance]
    late_windows: int
    late_nodes: _containers.RepeatedCompositeFieldContainer[LateNode]
    healthy_nodes_omitted: int
    history_windows: _containers.RepeatedScalarFieldContainer[int]
    latency_cdfs: _containers.RepeatedCompositeFieldContainer[LatencyCdf]
    spike_rates: SpikeRates
    held_nodes: _containers.RepeatedCompositeFieldContainer[HeldNode]
    def __init__(self, job_id: _Optional[str] = ..., windows: _Optional[int] = ..., gpus: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeReport, _Mapping]]] = ..., cluster: _Optional[_Union[ClusterPrediction, _Mapping]] = ..., windows_sampled: _Optional[int] = ..., mode: _Optional[str] = ..., imbalance: _Optional[_Iterable[_Union[GroupImbalance, _Mapping]]] = ..., late_windows: _Optional[int] = ..., late_nodes: _Optional[_Iterable[_Union[LateNode, _Mapping]]] = ..., healthy_nodes_omitted: _Optional[int] = ..., history_windows: _Optional[_Iterable[int]] = ..., latency_cdfs: _Optional[_Iterable[_Union[LatencyCdf, _Mapping]]] = ..., spike_rates: _Optional[_Union[SpikeRates, _Mapping]] = ..., held_nodes: _Optional[_Iterable[_Union[HeldNode, _Mapping]]] = ...) -> None: ...

class HeldNode(_message.Message):
    __slots__ = ("node", "gpus", "reason", "windows")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpus: int
    reason: str
    windows: int
    def __init__(self, node: _Optional[str] = ..., gpus: _Optional[int] = ..., reason: _Optional[str] = ..., windows: _Optional[int] = ...) -> None: ...

class LateNode(_message.Message):
    __slots__ = ("node", "windows")
    NODE_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    node: str
    windows: int
    def __init__(self, node: _Optional[str] = ..., windows: _Optional[int] = ...) -> None: ...

class GroupImbalance(_message.Message):
    __slots__ = ("group", "gpus", "signal", "unit", "value", "reference", "ratio")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    group: str
    gpus: int
    signal: str
    unit: str
    value: float
    reference: float
    ratio: float
    def __init__(self, group: _Optional[str] = ..., gpus: _Optional[int] = ..., signal: _Optional[str] = ..., unit: _Optional[str] = ..., value: _Optional[float] = ..., reference: _Optional[float] = ..., ratio: _Optional[float] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("version", "generated", "jobs")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    version: int
    generated: _timestamp_pb2.Timestamp
    jobs: _containers.RepeatedCompositeFieldContainer[JobReport]
    def __init__(self, version: _Optional[int] = ..., generated: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., jobs: _Optional[_Iterable[_Union[JobReport, _Mapping]]] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("job_id", "all_nodes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_NODES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    all_nodes: bool
    def __init__(self, job_id: _Optional[str] = ..., all_nodes: _Optional[bool] = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = ("job_id", "gpus", "nodes", "windows", "last_window")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    LAST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    gpus: int
    nodes: int
    windows: int
    last_window: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., gpus: _Optional[int] = ..., nodes: _Optional[int] = ..., windows: _Optional[int] = ..., last_window: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobSummary]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobSummary, _Mapping]]] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node", "agent_id", "last_window_end", "last_seen", "agent_version", "agent_backend", "probe_mode", "windows", "down")
    NODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_WINDOW_END_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_BACKEND_FIELD_NUMBER: _ClassVar[int]
    PROBE_MODE_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    DOWN_FIELD_NUMBER: _ClassVar[int]
    node: str
    agent_id: str
    last_window_end: _timestamp_pb2.Timestamp
    last_seen: _timestamp_pb2.Timestamp
    agent_version: str
    agent_backend: str
    probe_mode: str
    windows: int
    down: bool
    def __init__(self, node: _Optional[str] = ..., agent_id: _Optional[str] = ..., last_window_end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., agent_version: _Optional[str] = ..., agent_backend: _Optional[str] = ..., probe_mode: _Optional[str] = ..., windows: _Optional[int] = ..., down: _Optional[bool] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "window_seconds", "down_after_windows")
    NODES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DOWN_AFTER_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    window_seconds: float
    down_after_windows: float
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., window_seconds: _Optional[float] = ..., down_after_windows: _Optional[float] = ...) -> None: ...

class LocalHello(_message.Message):
    __slots__ = ("version", "pid")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    version: int
    pid: int
    def __init__(self, version: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class LocalConfig(_message.Message):
    __slots__ = ("mode", "agent_id", "node", "window_s", "overhead_budget", "always_share", "max_slice_s", "slice_guard_s", "min_samples")
    MODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_BUDGET_FIELD_NUMBER: _ClassVar[int]
    ALWAYS_SHARE_FIELD_NUMBER: _ClassVar[int]
    MAX_SLICE_S_FIELD_NUMBER: _ClassVar[int]
    SLICE_GUARD_S_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    mode: str
    agent_id: str
    node: str
    window_s: float
    overhead_budget: float
    always_share: float
    max_slice_s: float
    slice_guard_s: float
    min_samples: int
    def __init__(self, mode: _Optional[str] = ..., agent_id: _Optional[str] = ..., node: _Optional[str] = ..., window_s: _Optional[float] = ..., overhead_budget: _Optional[float] = ..., always_share: _Optional[float] = ..., max_slice_s: _Optional[float] = ..., slice_guard_s: _Optional[float] = ..., min_samples: _Optional[int] = ...) -> None: ...

class LocalFrame(_message.Message):
    __slots__ = ("start_ns", "end_ns", "window")
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    start_ns: int
    end_ns: int
    window: ProcessWindow
    def __init__(self, start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., window: _Optional[_Union[ProcessWindow, _Mapping]] = ...) -> None: ...

class LocalControl(_message.Message):
    __slots__ = ("pause", "pid")
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    pause: bool
    pid: int
    def __init__(self, pause: _Optional[bool] = ..., pid: _Optional[int] = ...) -> None: ...

class LocalControlDone(_message.Message):
    __slots__ = ("pids", "error")
    PIDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    error: str
    def __init__(self, pids: _Optional[_Iterable[int]] = ..., error: _Optional[str] = ...) -> None: ...

class LocalMessage(_message.Message):
    __slots__ = ("hello", "config", "frame", "control", "done")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    hello: LocalHello
    config: LocalConfig
    frame: LocalFrame
    control: LocalControl
    done: LocalControlDone
    def __init__(self, hello: _Optional[_Union[LocalHello, _Mapping]] = ..., config: _Optional[_Union[LocalConfig, _Mapping]] = ..., frame: _Optional[_Union[LocalFrame, _Mapping]] = ..., control: _Optional[_Union[LocalControl, _Mapping]] = ..., done: _Optional[_Union[LocalControlDone, _Mapping]] = ...) -> None: ...
