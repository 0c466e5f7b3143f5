# A stream and its consumer group, managed by Terraform through the rsc Admin API.
#
#   export TF_CLI_CONFIG_FILE=$PWD/terraform.rc      # dev_overrides: see docs/operations.md, "Terraform"
#   export RSC_COORDINATOR_URL=http://127.0.0.1:8080 RSC_ADMIN_PASSWORD=...
#   terraform plan && terraform apply
#
# (With dev_overrides, skip `terraform init`: there is nothing to download.)

terraform {
  required_providers {
    rsc = {
      source = "rsc/rsc"
    }
  }
}

# url, user and password may also be set here; the environment is used when they are not.
provider "rsc" {}

resource "rsc_stream" "orders" {
  name         = "orders"
  shard_count  = 4
  reshard_mode = "online"
}

resource "rsc_group" "billing" {
  stream          = rsc_stream.orders.name
  name            = "billing"
  max_concurrency = 4
  start_from      = "earliest"
}

# What producers route with: the layout of the stream.
data "rsc_stream_layout" "orders" {
  name = rsc_stream.orders.name
}

output "shard_keys" {
  value = data.rsc_stream_layout.orders.shard_keys
}
