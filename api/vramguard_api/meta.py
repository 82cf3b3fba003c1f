"""Core Kubernetes API shapes reused by vramguard's resources: LabelSelector
(meta/v1), Condition (metav1.Condition) and a minimal ObjectMeta."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from .labels import (
    LABEL_KEY_MAX,
    LABEL_KEY_RULES,
    LABEL_VALUE_MAX,
    LABEL_VALUE_RULES,
    MATCH_LABELS_KEY_RULES,
    REQUIREMENT_RULES,
    check_label_key,
    check_label_value,
    requirement_problem,
)


class APIModel(BaseModel):
    """Base of every API model: camelCase field names as in the Kubernetes API,
    unknown fields rejected (the API server prunes them; we fail loudly)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=False)

    def to_api(self) -> dict[str, Any]:
        """Return the JSON-compatible dict the API server expects (aliases, no None).

        The same dict as ``model_dump(mode="json", ...)``, through pydantic's JSON
        serialiser: a node's report (~1,400 nested models) dumps in less than half
        the time. (A NaN or infinite float, which no vramguard figure is, becomes
        None here; ``model_dump`` would keep it and make the request body invalid JSON.)"""
        return json.loads(self.model_dump_json(by_alias=True, exclude_none=True))


LabelValue = Annotated[
    str,
    Field(max_length=LABEL_VALUE_MAX, json_schema_extra={"x-kubernetes-validations": LABEL_VALUE_RULES}),
    AfterValidator(check_label_value),
]
"""A label value, as the core API validates it."""


class LabelSelectorRequirement(APIModel):
    """A label selector requirement (meta/v1 LabelSelectorRequirement), validated as the core API does."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": REQUIREMENT_RULES})

    key: str = Field(
        max_length=LABEL_KEY_MAX,
        description="The label key that the selector applies to: a qualified name ([prefix/]name: an optional "
        "DNS subdomain of at most 253 characters, then a name of at most 63 alphanumerics, '-', '_' or '.').",
        json_schema_extra={"x-kubernetes-validations": LABEL_KEY_RULES},
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="The key's relationship to the values: In, NotIn, Exists or DoesNotExist."
    )
    values: list[LabelValue] | None = Field(
        default=None,
        max_length=256,
        description="Values for In and NotIn (non-empty); must be empty for Exists and DoesNotExist. "
        "Each a label value: at most 63 alphanumerics, '-', '_' or '.', or empty.",
    )

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        return check_label_key(key)

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        problem = requirement_problem(self.operator, self.values, self.key)
        if problem is not None:
            raise ValueError(problem)
        return self


class LabelSelector(APIModel):
    """A label query over pods (meta/v1 LabelSelector). The requirements are ANDed;
    an empty selector matches every pod in the namespace."""

    match_labels: dict[str, LabelValue] | None = Field(
        default=None,
        alias="matchLabels",
        max_length=64,
        description="A map of {key: value} pairs; each is equivalent to an In requirement with one value. "
        "Keys are label keys (qualified names), values label values; at most 64 pairs.",
        json_schema_extra={"x-kubernetes-validations": MATCH_LABELS_KEY_RULES},
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None,
        alias="matchExpressions",
        max_length=32,
        description="A list of label selector requirements, ANDed.",
    )

    @field_validator("match_labels")
    @classmethod
    def _keys(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        for key in labels or {}:
            check_label_key(key)
        return labels


class Condition(APIModel):
    """One aspect of an object's state (metav1.Condition)."""

    type: str = Field(max_length=316, description="Type of condition in CamelCase, e.g. Ready, Violating, DataStale.")
    status: Literal["True", "False", "Unknown"] = Field(description="Status of the condition: True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        alias="observedGeneration",
        ge=0,
        description="The .metadata.generation that the condition was set from.",
    )
    last_transition_time: datetime = Field(
        alias="lastTransitionTime",
        description="When the condition last changed from one status to another (RFC 3339).",
    )
    reason: str = Field(
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="A programmatic identifier for the condition's last transition, in CamelCase.",
    )
    message: str = Field(default="", max_length=32768, description="A human readable message about the transition.")


class ObjectMeta(APIModel):
    """The subset of ObjectMeta that vramguard reads; other fields are kept as they are."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
