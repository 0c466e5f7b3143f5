"""Operator tools that are not the service: the admin commands, `rsc apply`, the Terraform
provider. Each talks to the coordinator only through `rsc.client.admin_api.AdminClient`."""
