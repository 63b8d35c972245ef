"""Scalers, label sets, reservations, admission records and capacity samples in the admin: view only.

Configuration comes from ``scalers.yaml`` (import / config-reload operation); host access and
capacity change through approved operations (``lib.readonly_admin``). The editable
models are :class:`~scalers.models.RegistryCredential` and
:class:`~scalers.models.OrchestratorAdminToken`: registry logins and orchestrator admin tokens are
secrets, kept out of ``scalers.yaml`` on purpose, and their secret is write-only here
(``docs/registry-credentials.md``, ``docs/real-kici-agent.md``).
"""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from lib.readonly_admin import ReadOnlyAdmin, ReadOnlyInline

from .credentials import CredentialError, encrypt_secret, normalize_registry
from .models import (
    CapacitySample,
    ConfigState,
    LabelSet,
    MachinePool,
    MetricCounter,
    OrchestratorAdminToken,
    RecoveryReport,
    RegistryCredential,
    Reservation,
    Scaler,
    ScaleRequest,
    ScalerTeardown,
)


class LabelSetInline(ReadOnlyInline):
    model = LabelSet
    fields = ("index", "normalized", "host_access", "host_access_override", "host_access_override_operation", "retired")


@admin.register(Scaler)
class ScalerAdmin(ReadOnlyAdmin):
    list_display = ("name", "type", "host", "max_agents", "machine_pool", "retiring", "updated_at")
    list_filter = ("type", "host", "retiring")
    search_fields = ("name",)
    inlines = [LabelSetInline]


@admin.register(LabelSet)
class LabelSetAdmin(ReadOnlyAdmin):
    list_display = ("scaler", "index", "normalized", "retired")
    list_filter = ("scaler",)


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = ("agent", "scaler", "cpus", "memory_bytes", "owner_instance", "created_at")
    list_filter = ("scaler", "owner_instance")


@admin.register(ScaleRequest)
class ScaleRequestAdmin(ReadOnlyAdmin):
    list_display = ("job_id", "outcome", "cap", "scaler_name", "agent_ref", "attempts", "decided_at")
    list_filter = ("outcome", "cap", "scaler_name")
    search_fields = ("job_id", "run_id", "agent_ref")


@admin.register(RecoveryReport)
class RecoveryReportAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at",
        "instance_id",
        "trigger",
        "spawning_agents_rehydrated",
        "spawning_dropped",
        "reservations_rehydrated",
        "reservations_dropped",
        "error",
    )
    list_filter = ("trigger", "instance_id")


@admin.register(CapacitySample)
class CapacitySampleAdmin(ReadOnlyAdmin):
    list_display = ("taken_at", "scaler", "agents", "max_agents", "cpus", "max_cpu", "memory_bytes", "registered")
    list_filter = ("scaler",)
    list_select_related = ("scaler",)


for _model in (MachinePool, ConfigState, MetricCounter, ScalerTeardown):
    admin.site.register(_model, ReadOnlyAdmin)


class _WriteOnlySecretForm(forms.ModelForm):
    """A form whose ``new_secret`` field is write-only: required on create (``missing_secret`` says
    so), left blank on edit to keep the stored one, encrypted into ``instance.secret``."""

    missing_secret = "a new record needs its secret"

    def clean(self):
        cleaned = super().clean() or {}
        plain = cleaned.get("new_secret") or ""
        if not plain and not self.instance.pk:
            self.add_error("new_secret", self.missing_secret)
        elif plain:
            try:
                self.instance.secret = encrypt_secret(plain)
            except CredentialError as exc:
                self.add_error("new_secret", str(exc))
        return cleaned


class RegistryCredentialForm(_WriteOnlySecretForm):
    """``name``, ``registry``, ``username`` and a write-only ``new_secret``: required on create,
    left blank on edit to keep the stored one. The stored secret is never put into the page."""

    new_secret = forms.CharField(
        label="Secret",
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="the password or token; never shown again. Leave blank to keep the stored one.",
    )
    missing_secret = "a new credential needs its secret"

    class Meta:
        model = RegistryCredential
        fields = ("name", "registry", "username")

    def clean_registry(self):
        try:
            return normalize_registry(self.cleaned_data["registry"])
        except ValueError as exc:
            raise ValidationError(str(exc)) from None


@admin.register(RegistryCredential)
class RegistryCredentialAdmin(admin.ModelAdmin):
    """Create, edit and delete registry logins; the secret is write-only (the form's ``new_secret``)."""

    form = RegistryCredentialForm
    list_display = ("name", "registry", "username", "updated_at")
    search_fields = ("name", "registry", "username")
    readonly_fields = ("created_at", "updated_at")
    fields = ("name", "registry", "username", "new_secret", "created_at", "updated_at")


class OrchestratorAdminTokenForm(_WriteOnlySecretForm):
    """``name`` and a write-only ``new_secret`` (the orchestrator's admin token): required on
    create, left blank on edit to keep the stored one. The stored token is never put into the page."""

    new_secret = forms.CharField(
        label="Admin token",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False),
        help_text="the orchestrator's admin token; never shown again. Leave blank to keep the stored one.",
    )
    missing_secret = "a new admin token needs its value"

    class Meta:
        model = OrchestratorAdminToken
        fields = ("name",)


@admin.register(OrchestratorAdminToken)
class OrchestratorAdminTokenAdmin(admin.ModelAdmin):
    """Create, edit and delete orchestrator admin tokens; the token is write-only (``new_secret``)."""

    form = OrchestratorAdminTokenForm
    list_display = ("name", "updated_at")
    search_fields = ("name",)
    readonly_fields = ("created_at", "updated_at")
    fields = ("name", "new_secret", "created_at", "updated_at")
