#include "server/health_service.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace conveyor {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {
constexpr const char* kLoaderService = "conveyor.v1.Loader";
}  // namespace

// One Watch call: writes the status, and each later one that differs from the last written.
// Every member is touched under the service's mutex; the reactor deletes itself in OnDone.
class HealthService::Watcher final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, std::string name) : service_(service), name_(std::move(name)) {}

  // Registers and sends the first status, or refuses past the bound (mu_ held).
  void StartLocked() {
    if (service_->watchers_.size() >= service_->max_watches_) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("more than ", service_->max_watches_,
                                       " health watches at once; Check answers without holding a call open")));
      return;
    }
    service_->watchers_.insert(this);
    UpdateLocked();
  }
  // Writes the current status if it differs from the last written and no write is in flight
  // (mu_ held); a status that changes meanwhile is written when that write is done.
  void UpdateLocked() {
    if (finished_ || writing_) return;
    const HealthCheckResponse::ServingStatus now = service_->StatusLocked(name_);
    if (sent_ && now == last_) return;
    last_ = now;
    sent_ = true;
    response_.set_status(now);
    writing_ = true;
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(service_->mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status::CANCELLED);
      return;
    }
    UpdateLocked();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(service_->mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(service_->mu_);
      service_->watchers_.erase(this);
    }
    delete this;
  }

 private:
  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  HealthService* const service_;
  const std::string name_;
  HealthCheckResponse response_;
  HealthCheckResponse::ServingStatus last_ = HealthCheckResponse::UNKNOWN;
  bool sent_ = false, writing_ = false, finished_ = false;
};

HealthCheckResponse::ServingStatus HealthService::StatusLocked(const std::string& service) const {
  if (!service.empty() && service != kLoaderService) return HealthCheckResponse::SERVICE_UNKNOWN;
  return serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx, const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  HealthCheckResponse::ServingStatus status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status = StatusLocked(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "no such service"));  // (as gRPC's own service)
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(grpc::CallbackServerContext*,
                                                                    const HealthCheckRequest* request) {
  auto* w = new Watcher(this, request->service().substr(0, 256));
  std::lock_guard<std::mutex> lock(mu_);
  w->StartLocked();
  return w;
}

void HealthService::SetServing(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  serving_ = serving;
  for (Watcher* w : watchers_) w->UpdateLocked();
}

size_t HealthService::watches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return watchers_.size();
}

}  // namespace conveyor
