# Entry points that are not Python tests. See docs/package.md and docs/charts.md.
#
#   make package VERSION=x.y.z [IMAGES=build/images/images.txt] [OUT=dist]
#       the offline packages dist/metax-gpu-k8s-package[-base].x.y.z.tar.gz
#       (without IMAGES, images/build.sh builds the component images first);
#       each holds metax-docker_x.y.z.tar too
#   make metax-docker VERSION=x.y.z [OUT=dist]
#       only dist/metax-docker_x.y.z.tar (metax-docker_x.y.z.<ARCH>.run installers)
#   make chart-docs      regenerate the option tables of docs/charts.md (Option tables)
#   make chart-lint      helm lint --strict both charts

PYTHON ?= python3
OUT ?= dist

.PHONY: package metax-docker chart-docs chart-lint

package:
ifndef VERSION
	$(error VERSION is required: make package VERSION=1.2.3)
endif
	package/build.sh $(VERSION) --out $(OUT) $(if $(IMAGES),--images $(IMAGES))

metax-docker:
ifndef VERSION
	$(error VERSION is required: make metax-docker VERSION=1.2.3)
endif
	$(PYTHON) package/metax_docker.py $(VERSION) --out $(OUT)

chart-docs:
	$(PYTHON) package/values_table.py

chart-lint:
	helm="$${HELM:-$$(lab/tools.sh helm)}"; \
	"$$helm" lint --strict charts/metax-gpu-extensions && \
	"$$helm" lint --strict charts/metax-operator --set driver.payload.version=0.0.0
